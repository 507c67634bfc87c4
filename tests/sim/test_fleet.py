"""Fleet simulation: every fleet on the same requests, routers, and the CLI's JSON shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controller.cli import main
from policies.types import Task
from sim.fleet_build import build_fleet
from sim.fleet_config import FleetLayout, PoolLayout
from sim.fleet_runner import fit_inputs, run_fleets, simulate_fleet
from sim.router import LeastLoaded, TaskPools
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.workload import Workload

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run_fleets(load_scenario(SCENARIOS / "ci-fleet.yaml"))


def test_every_fleet_runs_every_phase(report: dict[str, Any]) -> None:
    assert list(report["fleets"]) == [
        "uniform-no-spec",
        "uniform-static-k7",
        "uniform-static-k15",
        "uniform-schedule",
        "uniform-oracle",
        "draftctl-routed",
        "task-pools-oracle",
    ]
    for fleet in report["fleets"].values():
        assert set(fleet["phases"]) == {"c2-math", "c32-mixed"}
        assert fleet["goodput_tok_s"] > 0 and fleet["ttft_p99_s"] > 0
    assert report["fleets"]["uniform-no-spec"]["phases"]["c2-math"]["mean_spec_tokens"] == 0


def test_schedules_follow_the_batch_and_the_oracle_bounds_uniform_fleets(
    report: dict[str, Any],
) -> None:
    fleets = report["fleets"]
    schedule = fleets["uniform-schedule"]["phases"]
    # Batch ~2 per instance: the full block; ~32 per instance: a much smaller k.
    assert schedule["c2-math"]["mean_spec_tokens"] == 15
    assert schedule["c32-mixed"]["mean_spec_tokens"] < 10
    for name in ("uniform-static-k7", "uniform-static-k15", "uniform-schedule"):
        assert fleets["uniform-oracle"]["goodput_tok_s"] >= fleets[name]["goodput_tok_s"]
    summary = report["summary"]
    assert summary["best_uniform"] != "uniform-oracle"  # a bound never counts as a fleet
    assert set(summary["draftctl-routed"]) >= {
        "vs_best_uniform_static",
        "vs_uniform_schedule",
        "min_phase_vs_no_spec",
        "ttft_p99_vs_best_uniform",
    }


def test_task_pools_get_distinct_k_and_their_tasks_schedules(report: dict[str, Any]) -> None:
    pools = report["fleets"]["draftctl-routed"]["layout"]["pools"]
    assert pools["math-code"]["num_speculative_tokens"] == 15
    # Chat's schedule also peaks at 15; the gateway routes by k, so it is lowered to 14.
    assert pools["chat"]["num_speculative_tokens"] == 14
    chat = pools["chat"]["num_speculative_tokens_per_batch_size"]
    math = pools["math-code"]["num_speculative_tokens_per_batch_size"]
    k_at_32 = [next(k for lo, hi, k in s if lo <= 32 <= hi) for s in (math, chat)]
    assert k_at_32[0] > k_at_32[1]  # chat accepts less: a smaller k at the same batch


def test_a_one_instance_fleet_is_the_single_server() -> None:
    scenario = load_scenario(SCENARIOS / "ci-small.yaml")
    single = run_scenario(scenario)["policies"]["static-k7"]
    layout = FleetLayout(
        name="one",
        router="least-loaded",
        pools=[PoolLayout(name="p", instances=1, k_mode="fixed", spec_tokens=7)],
    )
    workload = Workload(scenario)
    fleet = simulate_fleet(scenario, workload, build_fleet(layout, fit_inputs(scenario, workload)))
    assert fleet["num_tokens"] == single["num_tokens"]
    assert fleet["phases"] == {
        name: {**phase, "ttft_p99_s": fleet["phases"][name]["ttft_p99_s"]}
        for name, phase in single["phases"].items()
    }


class FakeInstance:
    def __init__(self, load: int) -> None:
        self.load = load


def test_task_pools_route_home_and_spill_past_the_margin() -> None:
    pools = {"math-code": (15, [0, 1]), "chat": (7, [2])}
    homes = {Task.MATH: "math-code", Task.CODE: "math-code", Task.CHAT: "chat"}
    loads = [FakeInstance(3), FakeInstance(2), FakeInstance(9)]
    no_spill = TaskPools(pools, homes, 16, spill_margin=None)
    assert no_spill.route(Task.CHAT, loads) == 2  # type: ignore[arg-type]
    assert no_spill.route(Task.CODE, loads) == 1  # type: ignore[arg-type]
    spill = TaskPools(pools, homes, 16, spill_margin=4)
    assert spill.route(Task.CHAT, loads) == 1  # type: ignore[arg-type]  # 9 - 2 > 4
    assert spill.num_spilled == 1
    assert spill.route(Task.MATH, loads) == 1  # type: ignore[arg-type]


def test_task_pools_with_one_k_are_refused() -> None:
    with pytest.raises(ValueError, match="distinct k"):
        TaskPools({"a": (7, [0]), "b": (7, [1])}, {t: "a" for t in Task}, 16, None)


def test_least_loaded_rotates_ties() -> None:
    router = LeastLoaded()
    loads = [FakeInstance(1), FakeInstance(1), FakeInstance(5)]
    picks = {router.route(Task.MATH, loads) for _ in range(4)}  # type: ignore[arg-type]
    assert picks == {0, 1}


def test_layout_errors_name_the_problem(tmp_path: Path) -> None:
    from policies.validation import InvalidDocument

    text = (
        (SCENARIOS / "ci-fleet.yaml")
        .read_text()
        .replace("instances: 1, tasks: [chat]", "instances: 2, tasks: [chat]")
    )
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("../cost_tables", str(SCENARIOS.parent / "cost_tables")))
    with pytest.raises(InvalidDocument, match="4 instances, the fleet 3"):
        load_scenario(path)


def test_cli_prints_the_fleets_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            ["simulate", "--scenario", str(SCENARIOS / "ci-fleet.yaml"), "--json", "--no-progress"]
        )
        == 0
    )
    fleets = json.loads(capsys.readouterr().out)["fleets"]
    entry = fleets["draftctl-routed"]
    assert isinstance(entry["goodput_tok_s"], float) and isinstance(entry["ttft_p99_s"], float)
    assert set(entry["phases"]) == {"c2-math", "c32-mixed"}
    assert entry["phases"]["c32-mixed"]["goodput_tok_s"] > 0


def test_ragged_servers_run_at_their_own_widths_beside_padded_ones(tmp_path: Path) -> None:
    """Fleets of ragged servers (vLLM Model Runner V2-like: each row its own k, the draft's
    confidence read) run on the same requests; their pools get distinct k under task routing."""
    text = (SCENARIOS / "ci-fleet.yaml").read_text()
    text = text.replace("table: ../cost_tables/", f"table: {SCENARIOS.parent}/cost_tables/")
    text = text.replace("acceptance:\n", "acceptance:\n  confidence_auc: 0.82\n", 1)
    text = text.replace(
        "  layouts:\n",
        "  layouts:\n"
        "    - name: uniform-ragged-vllm-av\n      router: least-loaded\n      pools:\n"
        "        - {name: all, instances: 3, k_mode: ragged-vllm-av}\n"
        "    - name: ragged-pools\n      pools:\n"
        "        - {name: mc, instances: 2, tasks: [math, code], k_mode: ragged-allocator}\n"
        "        - {name: chat, instances: 1, tasks: [chat], k_mode: ragged-allocator}\n",
        1,
    )
    path = tmp_path / "ragged.yaml"
    path.write_text(text)
    fleets = run_fleets(load_scenario(path))["fleets"]
    for name in ("uniform-ragged-vllm-av", "ragged-pools"):
        assert fleets[name]["goodput_tok_s"] > fleets["uniform-no-spec"]["goodput_tok_s"] * 1.2
    pools = fleets["ragged-pools"]["layout"]["pools"]
    assert pools["mc"]["num_speculative_tokens"] != pools["chat"]["num_speculative_tokens"]
