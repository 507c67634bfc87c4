"""Open-loop phases (``arrival_rate``): seeded Poisson arrivals every fleet shares, no client
chains, throughput set by the arrivals under light load, and clear errors in scenario files."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.types import Task
from policies.validation import InvalidDocument
from sim.fleet_build import build_fleet
from sim.fleet_config import FleetLayout, PoolLayout
from sim.fleet_report import format_fleet_report
from sim.fleet_runner import fit_inputs, run_fleets, simulate_fleet, traffic_mix
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.workload import Workload

TABLE = Path(__file__).resolve().parents[2] / "cost_tables" / "qwen3-8b-h200.json"


def _scenario(tmp_path: Path, phases: str, name: str = "open.yaml") -> Path:
    path = tmp_path / name
    path.write_text(
        "name: open\nseed: 7\nblock_size: 16\n"
        f"cost: {{table: {TABLE}, verify_width_multiple: 1, batch_verify: padded}}\n"
        "acceptance:\n  parametric:\n"
        "    math: {first_rate: 0.888, last_rate: 0.758}\n"
        "    chat: {first_rate: 0.719, last_rate: 0.599}\n"
        "lengths:\n"
        "  math: {prompt_tokens: [100, 200], output_tokens: [100, 200]}\n"
        "  chat: {prompt_tokens: [100, 200], output_tokens: [100, 200]}\n"
        "policies: {static_spec_tokens: [7], include_oracle: false}\n"
        f"phases:\n{phases}"
    )
    return path


LIGHT = (
    "  - {name: light, duration_s: 30, arrival_rate: 2, mix: {math: 0.5, chat: 0.5}}\n"
    "  - {name: quiet, duration_s: 10, arrival_rate: 0, mix: {chat: 1}}\n"
)


def _fleet(scenario_path: Path, k: int, instances: int = 2) -> dict[str, object]:
    scenario = load_scenario(scenario_path)
    workload = Workload(scenario)
    layout = FleetLayout(
        name=f"k{k}",
        router="least-loaded",
        pools=[PoolLayout(name="p", instances=instances, k_mode="fixed", spec_tokens=k)],
    )
    return simulate_fleet(scenario, workload, build_fleet(layout, fit_inputs(scenario, workload)))


def test_every_fleet_serves_the_same_seeded_arrivals(tmp_path: Path) -> None:
    path = _scenario(tmp_path, LIGHT)
    plain, fast = _fleet(path, 0), _fleet(path, 7)
    light_plain, light_fast = plain["phases"]["light"], fast["phases"]["light"]  # type: ignore[index]
    # Poisson at 2/s for 30 s: 60 expected, sd ~7.7; the same draws for both fleets.
    assert 30 <= light_plain["num_requests_finished"] <= 90
    assert light_plain["num_requests_finished"] == light_fast["num_requests_finished"]
    # Light load: every request is served whatever k, so the tokens are the arrivals' tokens;
    # what drafting changes is the time per token.
    assert plain["num_tokens"] == fast["num_tokens"]
    assert light_fast["tpot_ms_p50"] < 0.7 * light_plain["tpot_ms_p50"]
    # A phase at rate 0 is idle: nothing arrives there (first tokens count by arrival).
    assert plain["phases"]["quiet"]["ttft_ms_mean"] is None  # type: ignore[index]


def test_a_finished_open_loop_request_sends_no_next_one(tmp_path: Path) -> None:
    """One long phase at a low rate: the count of requests depends on the arrivals only, not on
    how fast they finish (a closed loop would send many more to the faster server)."""
    path = _scenario(tmp_path, "  - {name: p, duration_s: 60, arrival_rate: 0.5, mix: {math: 1}}\n")
    report = run_scenario(load_scenario(path))["policies"]
    counts = {name: p["phases"]["p"]["num_requests_finished"] for name, p in report.items()}
    assert len(set(counts.values())) == 1 and 10 <= counts["no-spec"] <= 50


def test_another_seed_draws_other_arrivals(tmp_path: Path) -> None:
    path = _scenario(tmp_path, LIGHT)
    other = tmp_path / "other.yaml"
    other.write_text(path.read_text().replace("seed: 7", "seed: 8"))
    counts = [
        _fleet(p, 7)["phases"]["light"]["num_requests_finished"]  # type: ignore[index]
        for p in (path, other)
    ]
    tokens = [_fleet(p, 7)["num_tokens"] for p in (path, other)]
    assert counts[0] != counts[1] or tokens[0] != tokens[1]


def test_the_schedules_mix_weighs_open_phases_by_their_rate(tmp_path: Path) -> None:
    path = _scenario(
        tmp_path,
        "  - {name: a, duration_s: 10, arrival_rate: 3, mix: {math: 1}}\n"
        "  - {name: b, duration_s: 10, arrival_rate: 1, mix: {chat: 1}}\n",
    )
    mix = traffic_mix(load_scenario(path))
    assert mix == pytest.approx({Task.MATH: 0.75, Task.CHAT: 0.25})
    idle = _scenario(
        tmp_path, "  - {name: a, duration_s: 10, arrival_rate: 0, mix: {math: 1}}\n", "idle.yaml"
    )
    assert traffic_mix(load_scenario(idle)) == {Task.MATH: 1.0}


@pytest.mark.parametrize(
    ("phases", "message"),
    [
        (
            "  - {name: a, duration_s: 5, concurrency: 2, arrival_rate: 1, mix: {math: 1}}\n",
            "either concurrency",
        ),
        ("  - {name: a, duration_s: 5, mix: {math: 1}}\n", "either concurrency"),
        ("  - {name: a, duration_s: 5, arrival_rate: -1, mix: {math: 1}}\n", "arrival_rate"),
        (
            "  - {name: a, duration_s: 5, concurrency: 2, mix: {math: 1}}\n"
            "  - {name: b, duration_s: 5, arrival_rate: 1, mix: {math: 1}}\n",
            "mix closed-loop",
        ),
    ],
)
def test_scenario_errors_name_the_problem(tmp_path: Path, phases: str, message: str) -> None:
    with pytest.raises(InvalidDocument) as caught:
        load_scenario(_scenario(tmp_path, phases))
    assert any(message in str(p) for p in caught.value.problems), caught.value.problems


def test_latency_counts_requests_still_queued_at_the_end(tmp_path: Path) -> None:
    """Overload one server: its queue grows, the requests left at the end count up to it, so an
    overloaded fleet's mean latency is not flattered by the requests it never finished."""
    path = _scenario(
        tmp_path, "  - {name: flood, duration_s: 20, arrival_rate: 40, mix: {chat: 1}}\n"
    )
    one, three = _fleet(path, 7, instances=1), _fleet(path, 7, instances=3)
    flood_one = one["phases"]["flood"]  # type: ignore[index]
    assert flood_one["num_unfinished"] > 100
    assert one["latency_ms_mean"] > 2 * three["latency_ms_mean"]  # type: ignore[operator]
    assert flood_one["latency_ms_mean"] >= flood_one["ttft_ms_mean"]
    assert flood_one["num_requests_finished"] + flood_one["num_unfinished"] > 600


def test_an_open_loop_fleet_report_compares_latency(tmp_path: Path) -> None:
    path = _scenario(
        tmp_path,
        "  - {name: busy, duration_s: 10, arrival_rate: 12, mix: {math: 0.5, chat: 0.5}}\n"
        "fleet:\n  instances: 2\n  static_spec_tokens: [3, 7]\n  include_vllm_av: false\n"
        "  include_oracle: false\n  layouts:\n    - name: pools\n      pools:\n"
        "        - {name: m, instances: 1, tasks: [math, code]}\n"
        "        - {name: c, instances: 1, tasks: [chat]}\n",
    )
    report = run_fleets(load_scenario(path))
    summary, fleets = report["summary"], report["fleets"]
    assert summary["objective"] == "latency"
    uniform = {n: f["latency_ms_mean"] for n, f in fleets.items() if n.startswith("uniform-")}
    assert summary["best_uniform"] == min(uniform, key=lambda n: uniform[n])
    pools = fleets["pools"]["latency_ms_mean"]
    best = uniform[summary["best_uniform"]]
    assert summary["pools"]["vs_best_uniform"] == pytest.approx(best / pools)
    assert "latency" in format_fleet_report(report).splitlines()[2]
