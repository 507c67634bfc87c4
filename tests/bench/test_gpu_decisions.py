"""The GPU-decisions harness on the CPU (tiny random model): every policy runs, the results
file has the shape other checks read (issue #13), and every policy serves the same requests;
on the ragged engine (issue #16) the confidence-reading policies give rows of one step their
own k, and results of the two engines never mix."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from bench.decisions.planners import RowAllocationPlanner
from bench.gpu_decisions import main
from engines.step_controller import StepController

POLICIES = "no-spec,static-k7,dsd-schedule,vllm-av,goodput,oracle"


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


ENGINE_LOG = _Collect()


@pytest.fixture(scope="module")
def arm_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One CPU run of every policy; the engine's warnings (a planner that raises is logged and
    drafting goes off for the step, so a broken planner would still "run") are collected."""
    out = tmp_path_factory.mktemp("gpu") / "synthetic-tiny.json"
    argv = [
        "--arm",
        "synthetic-tiny",
        "--device",
        "cpu",
        "--scale",
        "0.04",
        "--repeats",
        "1",
        "--policies",
        POLICIES,
        "--prompt-tokens",
        "8,12",
        "--output-tokens",
        "12,24",
        "--out",
        str(out),
    ]
    engine_logger = logging.getLogger("engines.embedded.engine")
    engine_logger.addHandler(ENGINE_LOG)
    try:
        assert main(argv) == 0
    finally:
        engine_logger.removeHandler(ENGINE_LOG)
    return out


def test_no_policy_failed_inside_the_engine(arm_json: Path) -> None:
    assert [r.getMessage() for r in ENGINE_LOG.records] == []


def test_every_policy_ran_on_the_same_requests(arm_json: Path) -> None:
    report = json.loads(arm_json.read_text())
    runs = {run["policy"]: run for run in report["runs"]}
    assert set(runs) == set(POLICIES.split(","))
    tokens = {name: [p["tokens"] for p in run["phases"].values()] for name, run in runs.items()}
    assert len({tuple(t) for t in tokens.values()}) == 1  # same requests, same token counts
    assert runs["no-spec"]["phases"]["math"]["mean_spec_tokens"] == 0
    assert runs["static-k7"]["phases"]["mixed"]["mean_spec_tokens"] <= 7
    assert report["arm_info"]["synthetic"]["warning"].startswith("SYNTHETIC ACCEPTANCE")


def test_merged_results_file_has_the_documented_shape(arm_json: Path, tmp_path: Path) -> None:
    merged = tmp_path / "gpu_decisions.json"
    assert main(["--merge", str(arm_json), "--out", str(merged)]) == 0
    data = json.loads(merged.read_text())
    assert data["engine"] == "padded" and "command" in data
    policies = data["arms"]["synthetic-tiny"]["policies"]
    for name in POLICIES.split(","):
        cell = policies[name]
        assert {"tok_s_mean", "tok_s_spread", "repeats", "phases"} <= set(cell)
        for phase in ("math", "mixed", "chat"):
            assert {"tok_s_mean", "mean_spec_tokens", "step_ms_mean"} <= set(cell["phases"][phase])


def test_files_of_one_arm_pool_their_runs(arm_json: Path, tmp_path: Path) -> None:
    """A second call adding repeats of the same requests: the merged arm holds both calls' runs
    and every ratio carries its noise."""
    data = json.loads(arm_json.read_text())
    second = tmp_path / "second.json"
    for run in data["runs"]:
        run["tok_s"] *= 1.1
    second.write_text(json.dumps(data))
    merged = tmp_path / "gpu_decisions.json"
    assert main(["--merge", str(arm_json), str(second), "--out", str(merged)]) == 0
    arm = json.loads(merged.read_text())["arms"]["synthetic-tiny"]
    assert arm["calls"] == 2
    goodput = arm["policies"]["goodput"]
    assert goodput["repeats"] == 2 and len(goodput["tok_s_runs"]) == 2
    assert goodput["tok_s_spread"] == pytest.approx(goodput["tok_s_runs"][0] * 0.05)
    assert arm["ratios"]["noise_vs_best_static"] == pytest.approx(0.1 / 2.1 * 2)
    assert "noise" in arm["ratios"]["phases"]["math"]
    data["phases"][0]["num_requests"] += 1
    second.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="cannot pool"):
        main(["--merge", str(arm_json), str(second), "--out", str(merged)])


def test_each_step_is_on_the_timeline_and_the_plots_draw(arm_json: Path, tmp_path: Path) -> None:
    """k over time (issue #13's plots): every step of every phase, [rows, widest k, admitted, ms,
    two-phase wait ms, two-phase allocation ms, tokens verified, tokens emitted, two-phase, and
    the goodput planner's best drafting k, its gain over plain, plain ms, its ms], whose rows add
    up to the row-steps the phase counted and whose tokens to the phase's; the plot script
    draws both panels."""
    pytest.importorskip("matplotlib")
    from bench.decisions.plot import main as plot

    report = json.loads(arm_json.read_text())
    for run in report["runs"]:
        for phase in run["phases"].values():
            timeline = phase["timeline"]
            assert len(timeline) == phase["steps"]
            assert all(len(step) == 13 and step[2] in (0, 1) and step[3] > 0 for step in timeline)
            assert all(step[8] in (0, 1) for step in timeline)
            # the shared decision's best drafting k and its prices: a goodput batch planner's
            drafting = [step[9:] for step in timeline]
            if run["policy"] == "goodput":
                assert any(k > 0 and gain > 0 and plain_ms > 0 for k, gain, plain_ms, _ in drafting)
                assert all(k == 0 or ms >= plain_ms > 0 for k, _, plain_ms, ms in drafting)
            elif not run["policy"].startswith("goodput"):
                assert all(entry == [0, 0.0, 0.0, 0.0] for entry in drafting)
            assert sum(step[7] for step in timeline) == phase["tokens"]
            # the prefills are inside the calls that admitted, so inside the phase's time
            admitted_s = sum(step[3] for step in timeline if step[2]) / 1e3
            assert 0 < phase["prefill_s"] <= admitted_s + 1e-3
            assert sum(step[6] for step in timeline) == round(
                phase["verify_tokens_per_step"] * phase["steps"]
            )
            # a decode step (no admission, whose prefill emits too) emits one to k + 1 per row
            decode = [step for step in timeline if step[0] and not step[2]]
            assert decode and all(step[0] <= step[7] <= step[6] for step in decode)
            if run["policy"] == "no-spec":
                assert all(step[1] == 0 for step in timeline)
    png = tmp_path / "gpu.png"
    assert plot([str(arm_json), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_phase_says_why_the_planner_chose_its_k(arm_json: Path) -> None:
    """The goodput planner's reasons, tallied per phase (engine calls, and the gain over a
    plain step it expected for a shared decision), so a call's raw file shows why a phase ran
    the k it ran; policies without a planner have none."""
    report = json.loads(arm_json.read_text())
    for run in report["runs"]:
        for phase in run["phases"].values():
            reasons = phase["reasons"]
            if run["policy"] in ("no-spec", "static-k7", "oracle"):
                assert reasons == {}
                continue
            if run["policy"] != "goodput":
                continue
            assert reasons and sum(r["calls"] for r in reasons.values()) <= phase["steps"]
            shared = {k: r for k, r in reasons.items() if k.startswith("batch[")}
            assert shared, reasons
            for key, entry in shared.items():
                assert key.split()[1].startswith("k=")
                assert entry["expected_gain"] is None or entry["expected_gain"] > 0


def test_a_file_can_be_merged_under_another_arm_name(arm_json: Path, tmp_path: Path) -> None:
    """PATH=NAME keeps runs of one arm made on another day apart instead of pooling them."""
    merged = tmp_path / "results.json"
    assert (
        main(["--merge", str(arm_json), f"{arm_json}=synthetic-tiny-b", "--out", str(merged)]) == 0
    )
    arms = json.loads(merged.read_text())["arms"]
    assert set(arms) == {"synthetic-tiny", "synthetic-tiny-b"}
    assert arms["synthetic-tiny"]["calls"] == arms["synthetic-tiny-b"]["calls"] == 1


def test_gzipped_raw_calls_merge_to_the_same_results(arm_json: Path, tmp_path: Path) -> None:
    """The raw calls are committed as .json.gz: merging one gives what the plain file gives."""
    import gzip

    packed = tmp_path / "call.json.gz"
    packed.write_bytes(gzip.compress(arm_json.read_bytes()))
    plain, from_gz = tmp_path / "plain.json", tmp_path / "gz.json"
    assert main(["--merge", str(arm_json), "--out", str(plain)]) == 0
    assert main(["--merge", str(packed), "--out", str(from_gz)]) == 0
    assert from_gz.read_text() == plain.read_text()


# -- the ragged engine (issue #16) ---------------------------------------------------------------

RAGGED_LOG = _Collect()
# Per two-phase step of each policy: (drafted k per row, allocated k per row).
ALLOCATIONS: dict[str, list[tuple[list[int], list[int]]]] = {"goodput": [], "vllm-av": []}


def _spy(name: str, allocate: Any) -> Any:
    def spied(self: Any, views: Any, controllers: Any, confidence: Any) -> list[int]:
        ks = allocate(self, views, controllers, confidence)
        ALLOCATIONS[name].append(([len(c) for c in confidence], list(ks)))
        return ks

    return spied


@pytest.fixture(scope="module")
def ragged_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One CPU run of every policy on the ragged engine (warm-up included: rows of mixed k);
    the allocations of goodput's and vllm-av's two-phase steps are recorded."""
    out = tmp_path_factory.mktemp("ragged") / "synthetic-tiny-ragged.json"
    argv = [
        "--arm",
        "synthetic-tiny",
        "--label",
        "synthetic-tiny-ragged",
        "--verify-mode",
        "ragged",
        "--policies",
        "no-spec,static-k4,static-k7,static-k11,static-k15,dsd-schedule,vllm-av,goodput,"
        "goodput-slots,goodput-cap3,oracle,goodput@padded,vllm-av@padded,vllm-av-device,"
        "goodput-device,goodput-device-min1,goodput-device-cap3,goodput-device-slots,"
        "goodput-host-slots",
        "--device",
        "cpu",
        "--scale",
        "0.04",
        "--repeats",
        "1",
        "--prompt-tokens",
        "8,12",
        "--output-tokens",
        "12,24",
        "--out",
        str(out),
    ]
    engine_logger = logging.getLogger("engines.embedded.engine")
    engine_logger.addHandler(RAGGED_LOG)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StepController, "allocate", _spy("goodput", StepController.allocate))
        patch.setattr(
            RowAllocationPlanner, "allocate", _spy("vllm-av", RowAllocationPlanner.allocate)
        )
        try:
            assert main(argv) == 0
        finally:
            engine_logger.removeHandler(RAGGED_LOG)
    return out


def test_every_policy_runs_on_the_ragged_engine(ragged_json: Path) -> None:
    assert [r.getMessage() for r in RAGGED_LOG.records] == []
    report = json.loads(ragged_json.read_text())
    assert report["engine"] == "ragged" and report["arm_info"]["verify_mode"] == "ragged"
    runs = {run["policy"]: run for run in report["runs"]}
    assert set(runs) == {
        "no-spec",
        *(f"static-k{k}" for k in (4, 7, 11, 15)),
        "dsd-schedule",
        "vllm-av",
        "goodput",
        "goodput-slots",
        "goodput-cap3",
        "oracle",
        "goodput@padded",
        "vllm-av@padded",
        "vllm-av-device",
        "goodput-device",
        "goodput-device-min1",
        "goodput-device-cap3",
        "goodput-device-slots",
        "goodput-host-slots",
    }
    tokens = {name: [p["tokens"] for p in run["phases"].values()] for name, run in runs.items()}
    assert len({tuple(t) for t in tokens.values()}) == 1  # same requests, same token counts
    for phase in runs["oracle"]["phases"].values():  # verifies exactly each row's drawn run
        assert phase["verify_tokens_per_step"] > 1


def test_rows_of_one_step_get_their_own_k_on_the_ragged_engine(ragged_json: Path) -> None:
    """goodput's per-slot allocator and vllm-av's per-row budget: within one step, rows that
    drafted the same k verify different k (not the engine's clamp near a request's end)."""
    for name, steps in ALLOCATIONS.items():
        assert steps, f"{name} made no two-phase step"
        differing = [
            1
            for drafted, ks in steps
            if len({k for d, k in zip(drafted, ks, strict=True) if d == max(drafted)}) > 1
        ]
        assert differing, f"{name}: every row of every step got the same k"


def test_two_phase_steps_are_tallied_as_the_allocators(ragged_json: Path) -> None:
    """A two-phase policy's phases tally its allocator's decisions under ``allocator`` (or
    ``allocator (device)``) with the gain over a plain step it estimated."""
    report = json.loads(ragged_json.read_text())
    for name in ("goodput-slots", "goodput-device-slots", "goodput-host-slots"):
        reasons = [
            (key, entry)
            for run in report["runs"]
            if run["policy"] == name
            for phase in run["phases"].values()
            for key, entry in phase["reasons"].items()
        ]
        allocated = [entry for key, entry in reasons if key.startswith("allocator")]
        assert allocated, (name, reasons)
        assert all(
            entry["expected_gain"] is None or entry["expected_gain"] > 0 for entry in allocated
        )
    device = [
        key
        for run in report["runs"]
        if run["policy"] == "goodput-device-slots"
        for phase in run["phases"].values()
        for key in phase["reasons"]
    ]
    assert "allocator (device)" in device, device


def test_merging_ragged_files_gives_a_ragged_results_file(
    ragged_json: Path, arm_json: Path, tmp_path: Path
) -> None:
    merged = tmp_path / "gpu_decisions.json"
    assert main(["--merge", str(ragged_json), "--out", str(merged)]) == 0
    data = json.loads(merged.read_text())
    assert data["engine"] == "ragged"
    assert set(data["arms"]["synthetic-tiny-ragged"]["policies"]) >= {"goodput", "vllm-av"}
    with pytest.raises(ValueError, match=r"different engines \(padded: .*; ragged: "):
        main(["--merge", str(arm_json), str(ragged_json), "--out", str(merged)])
    legacy = json.loads(arm_json.read_text())
    del legacy["engine"]  # files from before --verify-mode: the padded engine
    old = tmp_path / "old.json"
    old.write_text(json.dumps(legacy))
    assert main(["--merge", str(old), str(arm_json), "--out", str(merged)]) == 0
    assert json.loads(merged.read_text())["engine"] == "padded"


def _decode_run(policy: str, shapes: dict[str, tuple[float, int]]) -> dict[str, Any]:
    phase = {
        "tok_s": 100.0,
        "mean_spec_tokens": 7.0,
        "step_ms_mean": 10.0,
        "host_us_per_step": None,
        "accept_length_by_task": {},
    }
    return {
        "policy": policy,
        "tok_s": 100.0,
        "phases": {"p": phase},
        "decode_step_s_by_shape": {k: list(v) for k, v in shapes.items()},
    }


def test_the_overhead_ratio_skips_shapes_with_a_handful_of_steps() -> None:
    """A shape goodput ran once (one step at 8 x 8 read as +5% on the H200) is no measure of
    the controller's overhead: only shapes both sides ran at least MIN_SHAPE_STEPS times."""
    from bench.decisions.report import MIN_SHAPE_STEPS, summarise

    runs = [
        _decode_run("goodput", {"8x8": (0.0120, 1), "8x16": (0.0122, 219)}),
        _decode_run("static-k7", {"8x8": (0.0114, 258), "64x8": (0.028, 79)}),
        _decode_run("static-k15", {"8x16": (0.0120, 224)}),
    ]
    ratios = summarise(runs, ["goodput", "static-k7", "static-k15"])["ratios"]
    assert MIN_SHAPE_STEPS > 1
    assert ratios["decode_step_vs_static"] == pytest.approx({"8x16": 0.0122 / 0.0120})


@pytest.mark.parametrize("name", ["goodput-cap3", "goodput-device-cap3"])
def test_a_capped_goodput_verifies_at_most_its_cap_in_two_phase_steps(
    ragged_json: Path, name: str
) -> None:
    """``goodput-cap3`` (and ``goodput-device-cap3``, allocated on the device): its two-phase
    rows draft (and so verify) at most 3 positions; its one-phase steps keep the policy's own
    bounds."""
    report = json.loads(ragged_json.read_text())
    (run,) = [run for run in report["runs"] if run["policy"] == name]
    steps = [step for phase in run["phases"].values() for step in phase["timeline"]]
    two_phase = [step for step in steps if step[5] > 0]
    assert two_phase and all(step[1] <= 3 for step in two_phase)
    if name.endswith("device-cap3"):  # allocated on the device: no wait for the confidence
        assert all(step[4] == 0 for step in two_phase)
        assert sum(run["device_scored"].values()) > 0


def test_goodput_device_slots_allocates_every_large_decode_step_on_the_device(
    ragged_json: Path,
) -> None:
    """``goodput-device-slots``: no chooser; every decode step of at least ``slots_min_batch``
    rows is two-phase and allocated on the device (no host wait), as vllm-av-device's are."""
    report = json.loads(ragged_json.read_text())
    (run,) = [run for run in report["runs"] if run["policy"] == "goodput-device-slots"]
    steps = [step for phase in run["phases"].values() for step in phase["timeline"]]
    large = [step for step in steps if step[0] >= 32 and not step[2]]
    assert large and all(step[5] > 0 and step[4] == 0 for step in large)
    assert sum(run["device_scored"].values()) > 0


@pytest.fixture(scope="module")
def burst_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The device-allocating policies with and without drafting bursts on the ragged engine,
    outputs long enough for bursts of whole-block drafts (4 steps x 16 positions)."""
    out = tmp_path_factory.mktemp("bursts") / "synthetic-tiny-bursts.json"
    policies = "goodput-device-slots,goodput-device-slots@burst4,vllm-av-device,"
    argv = _tiny_argv(out, policies + "vllm-av-device@burst4", 1, "--verify-mode", "ragged")
    argv += ["--output-tokens", "80,120", "--no-warm-run"]
    assert main(argv) == 0
    return out


@pytest.mark.parametrize("name", ["goodput-device-slots@burst4", "vllm-av-device@burst4"])
def test_device_allocated_steps_run_in_bursts_when_named_so(burst_json: Path, name: str) -> None:
    """``NAME@burst4`` of a device-allocating policy: its two-phase steps run in drafting
    bursts (fewer host round trips than drafting steps in the run's step counts), still
    allocated on the device (no host wait; the burst's host share on its first step) and
    scored once a burst (fewer scorings than drafting steps); without the suffix, one round
    trip and one scoring a step."""
    report = json.loads(burst_json.read_text())
    runs = {run["policy"]: run for run in report["runs"]}
    burst, single = runs[name], runs[name.partition("@")[0]]
    drafting = burst["step_counts"]["drafting"]
    assert drafting["steps"] > drafting["round_trips"] > 0
    assert 0 < sum(burst["device_scored"].values()) < drafting["steps"]
    once = single["step_counts"]["drafting"]
    assert once["steps"] == once["round_trips"] >= sum(single["device_scored"].values()) > 0
    steps = [step for phase in burst["phases"].values() for step in phase["timeline"]]
    two_phase = [step for step in steps if step[5] > 0]
    assert two_phase and all(step[4] == 0 for step in two_phase)


def test_two_phase_steps_record_their_host_wait(ragged_json: Path) -> None:
    """Each step of the timeline carries the two-phase wait on the host clock (blocked on the
    draft's confidence; from it to the verify's launch): non-zero only in the steps of the
    policies that allocate after the draft, and its mean per phase is in the summary."""
    report = json.loads(ragged_json.read_text())
    runs = {run["policy"]: run for run in report["runs"]}
    for name in ("goodput", "goodput-slots", "vllm-av", "vllm-av-device", "goodput-device"):
        phases = runs[name]["phases"].values()
        steps = [step for phase in phases for step in phase["timeline"]]
        assert all(len(step) == 13 for step in steps)
        assert any(step[5] > 0 for step in steps), name
        assert any(step[8] == 1 for step in steps), name  # the two-phase steps marked
        assert any(phase["two_phase_allocation_ms"] for phase in phases), name
        if name.endswith("-device"):  # allocated on the device: no wait for the confidence
            assert all(step[4] == 0 for step in steps), name
            scored = runs[name]["device_scored"]  # mostly scored while the step before ran
            assert scored["ahead"] > scored["late"] > 0, (name, scored)
    for name in ("static-k7", "oracle", "goodput@padded", "vllm-av@padded"):
        for phase in runs[name]["phases"].values():
            assert all(step[4] == step[5] == step[8] == 0 for step in phase["timeline"]), name
            assert phase["two_phase_allocation_ms"] is None


def test_a_padded_variant_runs_on_the_padded_graphs_and_switches_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NAME@padded builds NAME for a padded engine and runs it with the runner on its padded
    graphs; the runner is ragged again afterwards, also when the run fails."""
    from types import SimpleNamespace

    import bench.gpu_decisions as harness
    from bench.decisions.policies import Context
    from policies.model import GoodputSpec

    seen: list[tuple[str, str, str]] = []
    runner = SimpleNamespace(verify_mode="ragged")
    context = Context(16, 8, None, GoodputSpec(), {}, {}, None, 0, "ragged")  # type: ignore[arg-type]

    def fake_build(name: str, ctx: Any) -> Any:
        seen.append((name, ctx.verify_mode, runner.verify_mode))
        return SimpleNamespace(planner=None, single_steps=name == "oracle")

    def failing_run(*args: Any, **options: Any) -> Any:
        assert engine.plain_burst == (1 if seen[-1][0] == "oracle" else 4)
        raise RuntimeError("the run failed")

    monkeypatch.setattr(harness, "build", fake_build)
    monkeypatch.setattr(harness, "run_policy", failing_run)
    engine = SimpleNamespace(runner=runner, spec_burst=1, plain_burst=4, step_counts={})
    arm = SimpleNamespace(engine=engine, context=context, info={})
    with pytest.raises(RuntimeError, match="the run failed"):
        harness._run(arm, "goodput@padded", 0, [], [])  # type: ignore[arg-type]
    assert seen == [("goodput", "padded", "padded")]
    assert runner.verify_mode == "ragged" and arm.engine.spec_burst == 1
    with pytest.raises(RuntimeError, match="the run failed"):
        harness._run(arm, "goodput@burst4", 0, [], [])  # type: ignore[arg-type]
    assert seen[-1] == ("goodput", "ragged", "ragged") and arm.engine.spec_burst == 1
    with pytest.raises(RuntimeError, match="the run failed"):  # one plain step a call, then back
        harness._run(arm, "oracle", 0, [], [])  # type: ignore[arg-type]
    assert (engine.spec_burst, engine.plain_burst) == (1, 4)


def test_compiled_arms_need_cuda_and_are_recorded_in_the_arm_info(tmp_path: Path) -> None:
    """--compile-scope builds the runner with compiled forwards (CUDA only: they run as CUDA
    graphs); off leaves eager kernels; --attention goes to the runner either way (triton:
    CUDA only)."""
    import argparse

    from bench.decisions.arms import _compile, _kernel_info

    with pytest.raises(SystemExit):
        main(["--arm", "synthetic-tiny", "--device", "cpu", "--compile-scope", "layer"])
    with pytest.raises(SystemExit):
        main(["--arm", "synthetic-tiny", "--device", "cpu", "--attention", "triton"])
    with pytest.raises(SystemExit):
        main(["--arm", "synthetic-tiny", "--device", "cpu", "--compile-mode", "max-autotune"])
    with pytest.raises(SystemExit):
        main(["--arm", "synthetic-tiny", "--device", "cpu", "--linear", "gemv"])
    kernels = {"linear": "aten", "defer_context": False}
    layer = argparse.Namespace(
        compile_scope="layer",
        attention="sdpa",
        compile_mode="default",
        plain_burst=1,
        spec_burst=1,
        **kernels,
    )
    assert _compile(layer) == {
        "compile_forwards": True,
        "compile_scope": "layer",
        "compile_mode": "default",
        "attention": "sdpa",
        **kernels,
    }
    off = argparse.Namespace(
        compile_scope="off",
        attention="triton",
        compile_mode="default",
        linear="gemv",
        defer_context=True,
        plain_burst=4,
        spec_burst=3,
    )
    assert _compile(off) == {"attention": "triton", "linear": "gemv", "defer_context": True}
    assert _kernel_info(off) == {
        "attention": "triton",
        "linear": "gemv",
        "defer_context": True,
        "plain_burst": 4,
        "spec_burst": 3,
    }
    assert _kernel_info(layer) == {"compile_scope": "layer"}


def test_a_padded_variant_needs_a_ragged_arm(tmp_path: Path) -> None:
    base = ["--arm", "synthetic-tiny", "--device", "cpu", "--out", str(tmp_path / "x.json")]
    for argv in (
        [*base, "--policies", "goodput@padded"],  # a padded arm already is
        [*base, "--verify-mode", "ragged", "--policies", "goodput@ragged"],
    ):
        with pytest.raises(SystemExit):
            main(argv)


def test_an_untimed_warm_run_comes_first_and_is_not_reported(arm_json: Path) -> None:
    """The eager batched prefills' shapes are first used in an untimed run of the trace (a
    first timed run paid 1.1 s admission steps on the H200), which no summary counts."""
    report = json.loads(arm_json.read_text())
    assert report["warm_run_s"] > 0
    assert all(run["repeat"] >= 0 for run in report["runs"])


def _tiny_argv(out: Path, policies: str, repeats: int, *extra: str) -> list[str]:
    """A quick CPU call of the tiny synthetic arm."""
    argv = ["--arm", "synthetic-tiny", "--device", "cpu", *extra, "--policies", policies]
    argv += ["--scale", "0.04", "--repeats", str(repeats), "--prompt-tokens", "8,12"]
    return [*argv, "--output-tokens", "12,24", "--out", str(out)]


def test_the_policies_can_be_priced_with_the_engines_own_profiled_steps(tmp_path: Path) -> None:
    """``--cost-table engine``: the arm's engine is profiled at start-up (as the daemon's
    embedded backend does) and that table, draft included, prices every policy; the arm info
    says so. A committed table stays the default."""
    from bench.decisions import arms

    seen: list[arms.CostTable] = []
    real = arms._engine_table

    def spy(engine: Any) -> arms.CostTable:
        seen.append(real(engine))
        return seen[-1]

    out = tmp_path / "engine-priced.json"
    argv = _tiny_argv(out, "static-k7,goodput", 1, "--cost-table", "engine")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arms, "_engine_table", spy)
        assert main(argv) == 0
    (table,) = seen
    assert table.includes_draft and table.batch_sizes[0] == 1 and table.tokens_per_request[0] == 1
    assert all(t > 0 for row in table.step_time_s for t in row)
    data = json.loads(out.read_text())
    assert data["arm_info"]["cost_table"].startswith("engine steps profiled at start-up")
    assert set(data["summary"]["policies"]) == {"static-k7", "goodput"}


def test_warm_policies_learn_on_another_trace_and_carry_it_across_their_runs(
    arm_json: Path, tmp_path: Path
) -> None:
    """``--warm-policies``: each policy is built once, runs one untimed pass of a trace with
    other requests (keys ``warm-...``, so other synthetic draws), and its timed runs reuse
    that instance; a policy that learns nothing (static k) gets no pass; the arm info records
    the protocol, so a merge refuses to pool it with fresh-policy calls."""
    import bench.gpu_decisions as harness

    builds: list[str] = []
    first_keys: list[str] = []
    real_build, real_run = harness._build, harness.run_policy

    def spy_build(arm: Any, name: str) -> Any:
        builds.append(name)
        return real_build(arm, name)

    def spy_run(
        engine: Any, built: Any, phases: Any, jobs: Any, multiple: int, **options: Any
    ) -> Any:
        first_keys.append(jobs[0][0].key)
        return real_run(engine, built, phases, jobs, multiple, **options)

    out = tmp_path / "warm.json"
    argv = _tiny_argv(out, "static-k7,goodput,vllm-av", 2, "--warm-policies", "--no-warm-run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "_build", spy_build)
        patch.setattr(harness, "run_policy", spy_run)
        assert main(argv) == 0
    assert sorted(builds) == ["goodput", "static-k7", "vllm-av"]  # once each, not per run
    assert first_keys[:2] == ["warm-p0-r0"] * 2 and first_keys[2:] == ["p0-r0"] * 6
    data = json.loads(out.read_text())
    assert data["build_order"] == builds  # built in the recorded order
    assert data["arm_info"]["warm_policies"] is True
    assert set(data["warm_pass_s"]) == {"goodput", "vllm-av"}
    # the passes' runs are kept apart (with their timelines and views), in no figure
    warm_runs = data["warm_runs"]
    assert set(warm_runs) == {"goodput", "vllm-av"}
    assert all(run["repeat"] == -1 and run["policy"] == name for name, run in warm_runs.items())
    assert warm_runs["goodput"]["phases"]["mixed"]["planner_view"]["batch"] > 0
    assert all(run["repeat"] >= 0 for run in data["runs"]) and len(data["runs"]) == 6
    merged = tmp_path / "merged.json"
    with pytest.raises(ValueError, match="cannot pool"):
        main(["--merge", str(arm_json), str(out), "--out", str(merged)])


def test_warm_policies_are_built_in_an_order_drawn_from_the_order_seed() -> None:
    """Not the listed order (the instance built first of an A/A pair ran faster on the GPU,
    whichever copy it was): a permutation of the names, the same for the same seed, another
    for another seed."""
    from bench.gpu_decisions import _build_order, parse_args

    names = ["vllm-av-device", "vllm-av-device#2", "goodput", "static-k7", "oracle"]

    def order(*seed: str) -> list[str]:
        return _build_order(names, parse_args(["--arm", "synthetic-tiny", "--out", "x", *seed]))

    orders = {tuple(order("--order-seed", str(i))) for i in range(8)}
    assert all(sorted(o) == sorted(names) for o in orders)
    assert len(orders) > 4  # (a fixed order would give one)
    assert order("--order-seed", "s41") == order("--order-seed", "s41")
    assert order() == order("--seed", "0") != order("--seed", "1")


def test_an_aa_twin_is_another_instance_reported_on_its_own(tmp_path: Path) -> None:
    """``goodput#2`` builds goodput again (its own state) and runs it as one more policy of each
    block; the report pairs it with goodput (``paired.aa``) and holds every baseline's paired
    ratios against that A/A noise. A non-numeric instance is refused."""
    import bench.gpu_decisions as harness

    built: list[Any] = []  # the instances themselves: a freed one's id may be reused
    real_build = harness.build

    def spy(name: str, context: Any) -> Any:
        out = real_build(name, context)
        built.append(out)
        assert name == "goodput" or name.startswith("static-k")
        return out

    out = tmp_path / "aa.json"
    argv = _tiny_argv(out, "static-k7,goodput,goodput#2", 2, "--no-warm-run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "build", spy)
        assert main(argv) == 0
    assert len({id(b) for b in built}) == 6  # every run its own instance (no --warm-policies)
    data = json.loads(out.read_text())
    assert set(data["summary"]["policies"]) == {"static-k7", "goodput", "goodput#2"}
    paired = data["summary"]["ratios"]["paired"]
    assert paired["aa"]["blocks"] == 2 and paired["vs_static-k7"]["blocks"] == 2
    assert paired["noise_aa"] == max(abs(r - 1) for r in paired["aa"]["ratios"])
    assert isinstance(paired["vs_static-k7"]["outside_aa"], bool)
    with pytest.raises(SystemExit):
        main(_tiny_argv(tmp_path / "bad.json", "goodput#b", 1))


def test_paired_ratios_cancel_a_drift_between_blocks() -> None:
    """Each block's ratio is taken inside the block, so a machine that slows from one block to
    the next moves no paired ratio; the A/A twin's ratios set the noise a difference must
    clear."""
    from bench.decisions.report import summarise

    runs = []
    for call in range(2):
        for repeat in range(3):
            speed = 1.0 - 0.05 * (3 * call + repeat)  # the machine drifts down 25%
            for policy, tok_s in (("goodput", 106.0), ("goodput#2", 105.0), ("vllm-av", 100.0)):
                runs.append(
                    {
                        "policy": policy,
                        "repeat": repeat,
                        "call": call,
                        "tok_s": tok_s * speed,
                        "phases": {},
                    }
                )
    for run in runs:
        run["phases"] = {
            "all": {
                "tok_s": run["tok_s"],
                "mean_spec_tokens": 7.0,
                "step_ms_mean": 1.0,
                "host_us_per_step": None,
                "accept_length_by_task": {},
            }
        }
    ratios = summarise(runs, ["goodput", "goodput#2", "vllm-av"])["ratios"]
    paired = ratios["paired"]
    assert paired["vs_vllm-av"]["mean"] == pytest.approx(1.06)
    assert paired["vs_vllm-av"]["sd"] == pytest.approx(0.0, abs=1e-12)
    assert paired["noise_aa"] == pytest.approx(1 - 105 / 106)
    assert paired["vs_vllm-av"]["outside_aa"] is True
    assert ratios["noise_vs_vllm-av"] > 0.2  # the unpaired rule sees the drift as noise
    phase = paired["phases"]["all"]
    assert phase["vs_vllm-av"]["mean"] == pytest.approx(1.06)
    assert phase["noise_aa"] == pytest.approx(paired["noise_aa"])


def test_paired_with_a_common_prefill_takes_out_a_first_prefills_cost() -> None:
    """Every policy prefills the same prompts, but a new prefill shape's first use costs far
    more (the real pair, session 43: one 375 ms call): ``paired_common_prefill`` prices every
    run's prefill at the call's median for the phase, so a spike in one run moves no ratio
    there, while ``paired`` keeps it."""
    from bench.decisions.report import summarise

    runs = []
    for repeat in range(3):
        for policy, decode_s in (("goodput", 0.9), ("static-k7", 1.0)):
            prefill_s = 0.8 if (repeat, policy) == (0, "goodput") else 0.2  # one spike
            elapsed = decode_s + prefill_s
            cell = {
                "tok_s": 100 / elapsed,
                "tokens": 100,
                "elapsed_s": elapsed,
                "prefill_s": prefill_s,
                "mean_spec_tokens": 7.0,
                "step_ms_mean": 1.0,
                "host_us_per_step": None,
                "accept_length_by_task": {},
            }
            runs.append(
                {"policy": policy, "repeat": repeat, "tok_s": cell["tok_s"], "phases": {"m": cell}}
            )
    ratios = summarise(runs, ["goodput", "static-k7"])["ratios"]
    plain = ratios["paired"]["vs_static-k7"]["ratios"]
    assert plain[0] == pytest.approx(1.2 / 1.7) and plain[1] == pytest.approx(1.2 / 1.1)
    common = ratios["paired_common_prefill"]["vs_static-k7"]
    assert common["ratios"] == pytest.approx([1.2 / 1.1] * 3)  # the spike priced at 0.2 s
    assert common["sd"] == pytest.approx(0.0, abs=1e-12)
    assert ratios["paired_common_prefill"]["phases"]["m"]["vs_static-k7"]["mean"] == pytest.approx(
        1.2 / 1.1
    )
    for run in runs:  # runs without the fields: no such comparison
        del run["phases"]["m"]["prefill_s"]
    assert "paired_common_prefill" not in summarise(runs, ["goodput", "static-k7"])["ratios"]


def test_a_warm_planner_reads_each_runs_own_request_histories() -> None:
    """``--warm-policies`` keeps a planner across runs of one trace, whose requests reuse
    their ids: a row is reused only for the same request (the same history list), so a later
    run's outcomes reach the estimators, and a confidence of an earlier run's request of the
    same id is not read as this one's."""
    from bench.decisions.planners import DeviceRowAllocationPlanner
    from engines.embedded.events import RequestView

    def view(lengths: list[int], ks: list[int]) -> RequestView:
        context = {"task": "math"}
        return RequestView("job-1", len(lengths), lengths, 1, 5, context, ks, 15)

    planner = DeviceRowAllocationPlanner(
        lambda rows, b: None,  # type: ignore[arg-type,return-value]
        lambda rows, b: (None, rows),  # type: ignore[arg-type,return-value]
        lambda scoring, confidence, ks, lengths: None,
    )
    first = view([3, 2], [7, 7])
    assert planner._row(first).accept_lengths is first.accept_lengths
    planner.scored_on_device([first], [], [[0.9] * 15], [7], [8])
    second = view([1], [4])  # the next run's request of the same id
    row = planner._row(second)
    assert row.accept_lengths is second.accept_lengths and row.spec_tokens == [4]
    handed: Any = planner.slot_scoring([second], [], [15])  # the rule hands its rows back
    assert handed[0].draft_confidence is None
    handed = planner.slot_scoring([first], [], [15])
    assert handed[0].draft_confidence == [0.9] * 15


def test_vllm_av_on_the_device_scores_the_next_step_while_this_one_runs() -> None:
    """``prepare`` (the engine's overlap) scores the next step on this step's rows; the next
    step uses it when its rows are those (a finished request's row dropped, the budget scaled)
    and scores afresh when a row is new; each step that ran is observed with its scoring."""
    from bench.decisions.planners import DeviceRowAllocationPlanner
    from engines.embedded.events import RequestView
    from policies.baselines.vllm_av import VllmAdaptiveVerification, VllmAvSettings

    class Cost:
        def step_time_s(self, batch_size: int, spec_tokens: int) -> float:
            return 1.0 + 0.02 * spec_tokens

    av = VllmAdaptiveVerification(VllmAvSettings(15), Cost())
    observed: list[tuple[Any, list[int]]] = []

    def observe(scoring: Any, confidence: Any, ks: Any, lengths: Any) -> None:
        observed.append((scoring, list(lengths)))
        av.observed(scoring, confidence, ks, lengths)

    planner = DeviceRowAllocationPlanner(av.decide_rows, av.device_scoring, observe)

    def views(*ids: str) -> list[RequestView]:
        return [RequestView(i, 0, [], 4, 1, {"task": "math"}, [], 15) for i in ids]

    step = views("a", "b", "c", "d")
    planner.prepare(step, [])
    first = planner.slot_scoring(step, [], [15] * 4)
    assert planner.scored_ahead == 1 and first.capacities.tolist() == [15] * 4
    planner.scored_on_device(step, [], [[0.9] * 15] * 4, [6] * 4, [7] * 4)
    assert observed[-1][0] is first
    planner.prepare(step, [])
    fewer = views("a", "c", "d")  # "b" finished
    second = planner.slot_scoring(fewer, [], [15] * 3)
    assert planner.scored_ahead == 2 and second.base.shape[0] == 3
    planner.scored_on_device(fewer, [], [[0.9] * 15] * 3, [6] * 3, [7] * 3)
    planner.prepare(fewer, [])
    joined = views("a", "c", "d", "e")  # "e" is new
    third = planner.slot_scoring(joined, [], [15] * 4)
    assert planner.scored_late == 1 and third.base.shape[0] == 4
    assert len(observed) == 2
    # A drafting burst: its steps' scores all came back after the next scoring was made
    # ahead, which then read confidence a burst older: scored afresh on the newest instead.
    planner.scored_on_device(joined, [], [[0.9] * 15] * 4, [6] * 4, [7] * 4)
    planner.prepare(joined, [])
    for _ in range(2):
        planner.scored_on_device(joined, [], [[0.2] * 15] * 4, [6] * 4, [7] * 4)
    assert len(observed) == 5  # every step of the burst observed under its one scoring
    fresh = planner.slot_scoring(joined, [], [15] * 4)
    assert (planner.scored_ahead, planner.scored_late) == (2, 2)
    assert fresh.budget < third.budget  # priced on the burst's low confidence


def test_calls_pool_across_their_own_cost_profiles_and_keep_each(
    arm_json: Path, tmp_path: Path
) -> None:
    """Each call of an engine-profiled arm measures its own start-up profile (it differs by
    machine and run): calls still pool, and the arm keeps every call's profile; any other
    difference in the arm's setup still refuses to pool."""
    report = json.loads(arm_json.read_text())
    calls = []
    for i, profile in enumerate(({"1": {"1": 7.0}}, {"1": {"1": 7.5}})):
        call = dict(report, arm_info={**report["arm_info"], "cost_table_ms": profile})
        path = tmp_path / f"call{i}.json"
        path.write_text(json.dumps(call))
        calls.append(str(path))
    merged = tmp_path / "merged.json"
    assert main(["--merge", *calls, "--out", str(merged)]) == 0
    arm = json.loads(merged.read_text())["arms"]["synthetic-tiny"]
    assert arm["calls"] == 2
    assert [c["cost_table_ms"]["1"]["1"] for c in arm["cost_profile_ms_by_call"]] == [7.0, 7.5]
    other = dict(report, arm_info={**report["arm_info"], "block_size": 8})
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="cannot pool"):
        main(["--merge", calls[0], str(tmp_path / "other.json"), "--out", str(merged)])


def test_kmin_sets_the_goodput_policys_lower_bound_only() -> None:
    """``-kmin<N>`` after a goodput policy: the policy file's ``min_spec_tokens`` N (issue 16:
    "min may be set below 4 for experiments"); the rest of the name builds as before, and
    other policies do not take it."""
    from bench.decisions.policies import (
        STRENGTH_CHOICES,
        Context,
        PlainModesController,
        PrefillBlindController,
        build,
    )
    from engines.step_controller import StepController
    from policies.costmodel import CostTable
    from policies.model import GoodputSpec

    table = CostTable((1, 8), (1, 16), ((0.01, 0.012), (0.012, 0.02)), includes_draft=True)
    context = Context(16, 8, table, GoodputSpec(), {}, {}, None, 0, "ragged")
    for name, low in (("goodput-device-slots-kmin1", 1), ("goodput-kmin2", 2), ("goodput", 4)):
        built = build(name, context)
        assert isinstance(built.planner, StepController)
        active = built.planner._source.active()
        assert active.spec.bounds_for(16) == (low, 15), name
        assert active.spec.goodput.step_mode == ("slots" if "slots" in name else "auto")
    # goodput-device-min1 stays slots_min_batch 1, not a bound
    min1 = build("goodput-device-min1", context).planner._source.active().spec
    assert min1.min_spec_tokens == 4 and min1.goodput.slots_min_batch == 1
    min8 = build("goodput-device-min8", context).planner._source.active().spec
    assert min8.goodput.slots_min_batch == 8 and min8.goodput.slot_allocation == "device"
    with pytest.raises(ValueError, match="known are"):
        build("goodput-device-min0", context)
    with pytest.raises(ValueError, match="known are"):
        build("vllm-av-kmin1", context)
    # -plain<N>: request_plain_entry_steps N, the rest as the name before it builds
    plain8 = build("goodput-plain8", context).planner._source.active().spec
    assert plain8.goodput.request_plain_entry_steps == 8 and plain8.min_spec_tokens == 4
    both = build("goodput-kmin2-plain1", context).planner._source.active().spec
    assert both.goodput.request_plain_entry_steps == 1 and both.bounds_for(16) == (2, 15)
    assert GoodputSpec().request_plain_entry_steps == 3
    reprobe = build("goodput-plain8-reprobe16", context).planner._source.active().spec.goodput
    assert (reprobe.request_reprobe_steps, reprobe.request_plain_entry_steps) == (16, 8)
    with pytest.raises(ValueError, match="known are"):
        build("vllm-av-plain8", context)
    # goodput-probeplain: goodput with one setting on; goodput-cal / -nocal: calibrated (the
    # default since session 48) or not
    probing = build("goodput-probeplain", context).planner._source.active().spec.goodput
    assert probing.mode_probe_when_plain is True and GoodputSpec().mode_probe_when_plain is False
    # goodput-cut: the auto mode's tried blocks cut when they lose by far (off by default);
    # goodput-nocut: the default, named for session 52's calls
    cut = build("goodput-cut", context).planner._source.active().spec.goodput
    uncut = build("goodput-nocut", context).planner._source.active().spec.goodput
    assert cut.mode_cut_ratio == 0.75 and uncut.mode_cut_ratio == GoodputSpec().mode_cut_ratio == 0
    # goodput-drain: a draining batch judged by its longest row (off by default)
    drain = build("goodput-drain", context).planner._source.active().spec.goodput
    assert drain.drain_makespan is True and GoodputSpec().drain_makespan is False
    # goodput-prefillblind: the step controller told no prefill (the chooser as before s54)
    blind = build("goodput-prefillblind", context).planner
    assert isinstance(blind, PrefillBlindController) and blind._prefill_s == 0.0
    blind.prefill_time(0.5)
    told = build("goodput", context).planner
    told.prefill_time(0.5)
    assert blind._prefill_s == 0.0 and told._prefill_s == 0.5
    # goodput-plainmodes: the auto mode as before session 56 (plain steps timed, a two-phase
    # incumbent's steps two-phase while plain)
    plainmodes = build("goodput-plainmodes", context).planner
    assert isinstance(plainmodes, PlainModesController)
    assert plainmodes._source.active().spec.goodput.mode_two_phase_when_plain is True
    assert plainmodes._times_mode_step(False) and not told._times_mode_step(False)
    assert GoodputSpec().mode_two_phase_when_plain is False
    for name, calibrated in (("goodput-cal", True), ("goodput-nocal", False)):
        varied = build(name, context).planner._source.active().spec.goodput
        assert varied.shared_calibration is calibrated, name
    assert GoodputSpec().shared_calibration is True
    # goodput-calone: calibrated with one factor for every task (the default: one per task)
    one = build("goodput-calone", context).planner._source.active().spec.goodput
    assert one.shared_calibration is True and one.calibration_by_task is False
    assert GoodputSpec().calibration_by_task is True
    # goodput-noramp: every decision held for the full spacing (the default ramps)
    held = build("goodput-noramp", context).planner._source.active().spec.goodput
    assert held.ramp_drafting_holds is False and GoodputSpec().ramp_drafting_holds is True
    # goodput-strength: each task's request strength learnt among STRENGTH_CHOICES
    learnt = build("goodput-strength", context).planner._source.active().spec.goodput
    assert learnt.request_strength_choices == STRENGTH_CHOICES
    assert GoodputSpec().request_strength_choices == []


def test_a_burst_variant_runs_its_drafting_steps_in_bursts(tmp_path: Path) -> None:
    """``NAME@burst<N>`` runs NAME with the engine's ``spec_burst`` at N (switched back after):
    on the synthetic arm static-k7 and static-k7@burst4 emit the same tokens (the draws are
    the same), the burst variant in fewer engine calls; on an arm of bursts (``--spec-burst
    4``) ``NAME@burst1`` runs one drafting step a call, as vLLM does, and so does the oracle
    (it reads each step's draws); a bad N is refused."""
    import bench.gpu_decisions as harness
    from bench.decisions import driver

    calls: dict[int, int] = {}
    real = driver.run_policy

    def counted(engine: Any, *args: Any, **kwargs: Any) -> Any:
        step = engine.step
        count = 0

        def stepped() -> Any:
            nonlocal count
            count += 1
            return step()

        engine.step = stepped
        try:
            return real(engine, *args, **kwargs)
        finally:
            del engine.step
            calls[engine.spec_burst] = calls.get(engine.spec_burst, 0) + count

    out = tmp_path / "burst.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "run_policy", counted)
        assert main(_tiny_argv(out, "static-k7,static-k7@burst4", 1, "--no-warm-run")) == 0
    runs = {r["policy"]: r for r in json.loads(out.read_text())["runs"]}
    tokens = {name: sum(p["tokens"] for p in run["phases"].values()) for name, run in runs.items()}
    assert tokens["static-k7"] == tokens["static-k7@burst4"] > 0
    assert set(calls) == {1, 4} and calls[4] < calls[1]
    single = dict(calls)
    calls.clear()
    argv = _tiny_argv(out, "static-k7,static-k7@burst1", 1, "--no-warm-run", "--spec-burst", "4")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "run_policy", counted)
        assert main(argv) == 0
    assert calls == {4: single[4], 1: single[1]}  # the arm's bursts, and one step a call
    calls.clear()  # the oracle decides every step from its draws: never a burst
    argv = _tiny_argv(out, "oracle", 1, "--no-warm-run", "--spec-burst", "4")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "run_policy", counted)
        assert main(argv) == 0
    assert set(calls) == {1}
    for bad in ("static-k7@burst0", "static-k7@burst17", "static-k7@bursts"):
        with pytest.raises(SystemExit):
            main(_tiny_argv(tmp_path / "bad.json", bad, 1))


def test_the_oracle_decodes_plain_steps_one_at_a_time_on_an_arm_of_plain_bursts(
    tmp_path: Path,
) -> None:
    """The oracle verifies each row's drawn run, so it emits exactly what static-k15 emits in
    every step (run + 1 tokens) and takes its steps; a run of 0 is a plain step (k = 0), which
    on an arm of plain bursts (the CUDA default) would run ``plain_burst`` plain steps where
    the next ones could accept long runs: the harness runs the oracle's plain steps one at a
    time (and puts the engine's setting back after)."""
    out = tmp_path / "oracle.json"
    argv = ["--arm", "synthetic-tiny", "--device", "cpu", "--policies", "oracle,static-k15"]
    argv += ["--scale", "0.15", "--repeats", "1", "--no-warm-run", "--plain-burst", "4"]
    assert main([*argv, "--phases", "math:1:6:math=1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["arm_info"]["plain_burst"] == 4
    runs = {r["policy"]: r["phases"] for r in report["runs"]}
    oracle_ks = [k for p in runs["oracle"].values() for _, k, *_ in p["timeline"]]
    assert 0 in oracle_ks  # it did run plain steps
    for phase, oracle in runs["oracle"].items():
        assert (oracle["steps"], oracle["tokens"]) == (
            runs["static-k15"][phase]["steps"],
            runs["static-k15"][phase]["tokens"],
        )


def _drifting_runs(speeds: dict[str, float]) -> list[dict[str, Any]]:
    """Two blocks of one run per policy at these tok/s, the second block 10% slower."""
    runs = []
    for repeat in range(2):
        drift = 1.0 - 0.1 * repeat
        for policy, tok_s in speeds.items():
            phase = {"tok_s": tok_s * drift, "mean_spec_tokens": 7.0, "step_ms_mean": 1.0}
            phase |= {"host_us_per_step": None, "accept_length_by_task": {}}
            runs.append(
                {"policy": policy, "repeat": repeat, "tok_s": tok_s * drift, "phases": {"p": phase}}
            )
    return runs


def test_burst_variants_are_paired_with_their_own_policy_and_vllm_av() -> None:
    """``NAME@burst<N>`` is reported over NAME and over vllm-av-device inside each block."""
    from bench.decisions.report import summarise

    speeds = {"goodput": 100.0, "goodput@burst4": 108.0, "vllm-av-device": 96.0}
    speeds |= {"static-k7": 90.0, "static-k7@burst4": 99.0}
    paired = summarise(_drifting_runs(speeds), list(speeds))["ratios"]["paired"]
    bursts = paired["bursts"]
    assert bursts["goodput@burst4"]["vs_goodput"]["mean"] == pytest.approx(1.08)
    assert bursts["goodput@burst4"]["vs_vllm-av-device"]["mean"] == pytest.approx(108 / 96)
    assert bursts["static-k7@burst4"]["vs_static-k7"]["mean"] == pytest.approx(1.1)
    assert bursts["static-k7@burst4"]["vs_static-k7"]["blocks"] == 2
    assert paired["phases"]["p"]["bursts"]["goodput@burst4"]["vs_goodput"]["sd"] == pytest.approx(
        0.0, abs=1e-12
    )


def test_goodput_is_compared_with_vllms_rule_as_vllm_runs_it_on_an_arm_of_bursts() -> None:
    """On an arm of drafting bursts (``--spec-burst 4``, the engine's default) every policy
    bursts, vLLM's rule included; ``vllm-av-device@burst1`` is that rule one step a round trip,
    as vLLM runs it, and goodput is reported over both, overall and per phase."""
    from bench.decisions.report import summarise

    speeds = {"goodput": 110.0, "vllm-av-device": 105.0, "vllm-av-device@burst1": 100.0}
    speeds |= {"static-k7": 90.0}
    summary = summarise(_drifting_runs(speeds), list(speeds))["ratios"]
    assert summary["vs_vllm-av-device@burst1"] == pytest.approx(1.1)
    assert summary["vs_vllm-av-device"] == pytest.approx(110 / 105)
    paired = summary["paired"]
    assert paired["vs_vllm-av-device@burst1"]["mean"] == pytest.approx(1.1)
    assert paired["phases"]["p"]["vs_vllm-av-device@burst1"]["blocks"] == 2


def test_a_call_of_burst_policies_alone_is_paired_too() -> None:
    """Without ``goodput`` in the call (e.g. ``goodput-device@burst4`` against vLLM's rule):
    each burst policy over its base when it ran, over vllm-av-device as vLLM runs it and in
    the same bursts, and over the best static k in those bursts; an A/A twin of any policy
    over its original; per phase the same."""
    from bench.decisions.report import summarise

    speeds = {"goodput-device@burst4": 110.0, "goodput@burst4": 105.0, "vllm-av-device": 100.0}
    speeds |= {"vllm-av-device@burst4": 104.0, "static-k7": 90.0, "static-k7@burst4": 95.0}
    speeds |= {"vllm-av-device#2": 99.0}
    paired = summarise(_drifting_runs(speeds), list(speeds))["ratios"]["paired"]
    assert paired["twins"]["vllm-av-device#2"]["mean"] == pytest.approx(0.99)
    device = paired["bursts"]["goodput-device@burst4"]
    assert set(device) == {"vs_vllm-av-device", "vs_vllm-av-device@burst4", "vs_static-k7@burst4"}
    assert device["vs_vllm-av-device"]["mean"] == pytest.approx(1.1)
    assert device["vs_vllm-av-device@burst4"]["mean"] == pytest.approx(110 / 104)
    assert device["vs_static-k7@burst4"]["mean"] == pytest.approx(110 / 95)
    assert paired["bursts"]["static-k7@burst4"]["vs_static-k7"]["blocks"] == 2
    phase = paired["phases"]["p"]["bursts"]["vllm-av-device@burst4"]
    assert phase["vs_vllm-av-device"]["mean"] == pytest.approx(1.04)
    assert "aa" not in paired and "vs_static-k7" not in paired  # (goodput's own: none here)


def test_unseen_ends_are_recorded_and_every_policy_counts_the_same_tokens(tmp_path: Path) -> None:
    """``--ends unseen``: requests end where the engine cannot foresee (the arm info says so);
    single steps and drafting bursts count the same tokens per phase, and the bursts ran."""
    out = tmp_path / "unseen.json"
    argv = _tiny_argv(out, "static-k7,static-k7@burst4", 1, "--ends", "unseen", "--no-warm-run")
    assert main([*argv, "--output-tokens", "40,60"]) == 0
    report = json.loads(out.read_text())
    assert report["arm_info"]["ends"] == "unseen"
    runs = {run["policy"]: run for run in report["runs"]}
    tokens = {name: [p["tokens"] for p in run["phases"].values()] for name, run in runs.items()}
    assert tokens["static-k7"] == tokens["static-k7@burst4"]
    drafting = runs["static-k7@burst4"]["step_counts"]["drafting"]
    assert drafting["steps"] > drafting["round_trips"]


def test_cuda_defaults_are_the_engines_own_unless_a_flag_says_otherwise(tmp_path: Path) -> None:
    """``--cuda-defaults``: the kernels, bursts and pricing the embedded engine runs by default
    on CUDA (EmbeddedConfig's), each flag given beside it kept; CUDA only."""
    from bench.gpu_decisions import cuda_defaults, parse_args
    from engines.config import EmbeddedConfig

    base = ["--arm", "synthetic-8b", "--out", str(tmp_path / "x.json")]
    plain = parse_args(base)
    args = parse_args([*base, "--cuda-defaults"])
    fields = EmbeddedConfig.model_fields
    want = {
        "attention": "triton",
        "linear": "fused",
        "defer_context": fields["defer_context"].default,
        "spec_burst": fields["spec_burst"].default,
        "plain_burst": fields["plain_burst"].default,
        "plain_chain": fields["plain_chain"].default,
        "cost_table": "engine",
    }
    assert cuda_defaults() == want
    assert {name: getattr(args, name) for name in want} == want
    assert {name: getattr(plain, name) for name in want} != want  # the pooling defaults
    assert (want["spec_burst"], want["plain_burst"], want["defer_context"]) == (4, 4, True)
    kept = parse_args([*base, "--cuda-defaults", "--spec-burst", "1", "--linear=aten"])
    assert (kept.spec_burst, kept.linear, kept.plain_burst) == (1, "aten", 4)
    assert want["plain_chain"] is True and plain.plain_chain is False
    unchained = parse_args([*base, "--cuda-defaults", "--no-plain-chain"])
    assert (unchained.plain_chain, unchained.plain_burst) == (False, 4)
    with pytest.raises(SystemExit):
        parse_args([*base, "--device", "cpu", "--cuda-defaults"])


def test_learning_policies_say_what_they_believed_mid_phase(arm_json: Path) -> None:
    """``planner_view``: goodput's priced step times and expected accept lengths once half a
    phase's requests were in; nothing for policies without online models."""
    runs = {run["policy"]: run for run in json.loads(arm_json.read_text())["runs"]}
    assert all(p["planner_view"] is None for p in runs["static-k7"]["phases"].values())
    ran = 0
    for phase, concurrency in (("math", 1), ("mixed", 64), ("chat", 8)):
        view = runs["goodput"]["phases"][phase]["planner_view"]
        assert view["batch"] == concurrency
        step_ms = [view["step_ms"][str(k)] for k in (0, 3, 7, 11, 15)]
        assert min(step_ms) > 0  # (learnt: a width's own fit may price it under a narrower)
        fit = view["cost_fit"]
        assert fit["row"] >= concurrency and 0 <= fit["widths_seen"] <= len(fit["widths"])
        assert fit["correction"] > 0 and fit["overhead_ms"] >= 0
        assert all(r > 0 and 0 <= w <= 1 for r, w in fit["widths"].values())
        assert set(fit["width_steps"]) <= set(fit["widths"])  # the widths that have run
        for steps, rows, predicted_ms, observed_ms, clipped in fit["width_steps"].values():
            assert steps >= 1 and rows >= 1 and predicted_ms > 0 and observed_ms > 0
            assert 0 <= clipped <= steps
        ran += len(fit["width_steps"])
        for each in view["tasks"].values():
            expected = [each["expected_accept"][str(k)] for k in (0, 3, 7, 11, 15)]
            assert expected[0] == 1.0 and expected == sorted(expected) and expected[-1] <= 16
            assert len(each["rates"]) == len(each["trials"]) == 15
        shared = view["last_shared"]
        assert shared["why"] in {"best", "hold", "probe", "none"}
        # each task's calibration factor (on by default), within its 0.25-1.5 clamp
        assert set(view["calibration"]) == {"math", "code", "chat"}
        assert all(0.25 <= f <= 1.5 for f in view["calibration"].values())
        if shared["rows"]:
            per_row = [shared["expected_accept_per_row"][str(k)] for k in (0, 3, 7, 11, 15)]
            assert per_row[0] == 1.0 and per_row == sorted(per_row)
    assert ran  # some phase's row has run steps of some width by mid-phase


def test_planner_view_says_what_the_step_mode_chooser_measured(
    arm_json: Path, ragged_json: Path
) -> None:
    """``planner_view.step_modes``: the auto step mode's buckets (the mode run outside probes,
    each mode's tok/s, the paired ratio it chooses on); none where no chooser runs (goodput on
    a padded engine runs one shared k). ``mode_told``: the chooser's inputs, step by step."""
    padded = {run["policy"]: run for run in json.loads(arm_json.read_text())["runs"]}
    assert all(p["planner_view"]["step_modes"] == [] for p in padded["goodput"]["phases"].values())
    ragged = {run["policy"]: run for run in json.loads(ragged_json.read_text())["runs"]}
    # two-phase allowed from one row: a chooser learns in every phase's bucket (the view is
    # taken mid-phase: a bucket's steps are told to it at the next plan, so some may have none)
    seen = []
    for phase in ragged["goodput-device-min1"]["phases"].values():
        buckets = phase["planner_view"]["step_modes"]
        seen += buckets
        assert buckets and [b["rows"] for b in buckets] == sorted(b["rows"] for b in buckets)
        for bucket in buckets:
            assert bucket["incumbent"] in {"learning", "one-phase", "two-phase"}
            assert bucket["pairs"] >= 0 and (bucket["paired_ratio"] is None) == (
                bucket["pairs"] == 0
            )
            rates = (bucket["one_phase_tok_s"], bucket["two_phase_tok_s"])
            assert all(r is None or r > 0 for r in rates)  # None: no step of it recorded yet
    assert any(b["two_phase_tok_s"] for b in seen)  # (this short run makes no pairs)
    # ... and every step as its chooser was told it (rows, two-phase, tokens, ms), in order;
    # none for a policy without a chooser
    told = [s for p in ragged["goodput-device-min1"]["phases"].values() for s in p["mode_told"]]
    assert told and any(two for _, two, _, _ in told)
    assert all(rows >= 1 and tokens >= rows and ms > 0 for rows, _, tokens, ms in told)
    assert all(p["mode_told"] == [] for p in ragged["static-k7"]["phases"].values())


def test_a_chain_variant_chains_its_plain_bursts(tmp_path: Path) -> None:
    """``NAME@chain`` runs NAME with the engine's ``plain_chain`` on (switched back after):
    on the synthetic arm with plain bursts no-spec and no-spec@chain emit the same tokens, the
    chained runs queueing bursts behind bursts; ``summary.ratios.paired.chains`` pairs each
    with NAME."""
    import bench.gpu_decisions as harness
    from bench.decisions import driver

    chained: dict[str, int] = {}
    real = driver.run_policy

    def counted(engine: Any, built: Any, *args: Any, **kwargs: Any) -> Any:
        queue = engine.runner.plain_queue
        count = 0

        def queued(*a: Any, **k: Any) -> Any:
            nonlocal count
            count += k.get("after") is not None
            return queue(*a, **k)

        engine.runner.plain_queue = queued
        try:
            return real(engine, built, *args, **kwargs)
        finally:
            del engine.runner.plain_queue
            chained[str(engine.plain_chain)] = chained.get(str(engine.plain_chain), 0) + count

    out = tmp_path / "chain.json"
    argv = _tiny_argv(out, "no-spec,no-spec@chain", 1, "--no-warm-run", "--plain-burst", "4")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "run_policy", counted)
        assert main(argv) == 0
    report = json.loads(out.read_text())
    runs = {r["policy"]: r for r in report["runs"]}
    tokens = {name: sum(p["tokens"] for p in run["phases"].values()) for name, run in runs.items()}
    assert tokens["no-spec"] == tokens["no-spec@chain"] > 0
    assert chained["False"] == 0 and chained["True"] > 0
    chains = report["summary"]["ratios"]["paired"]["chains"]
    assert chains["no-spec@chain"]["vs_no-spec"]["blocks"] == 1


def test_chain_variants_are_paired_with_their_own_policy_and_no_spec() -> None:
    """``NAME@chain`` is reported over NAME, no-spec@chain and no-spec inside each block."""
    from bench.decisions.report import summarise

    speeds = {"goodput": 100.0, "goodput@chain": 106.0, "no-spec": 98.0, "no-spec@chain": 104.0}
    speeds |= {"static-k7": 90.0}
    paired = summarise(_drifting_runs(speeds), list(speeds))["ratios"]["paired"]
    chains = paired["chains"]
    assert chains["goodput@chain"]["vs_goodput"]["mean"] == pytest.approx(1.06)
    assert chains["goodput@chain"]["vs_no-spec@chain"]["mean"] == pytest.approx(106 / 104)
    assert chains["no-spec@chain"]["vs_no-spec"]["mean"] == pytest.approx(104 / 98)
    assert "vs_no-spec@chain" not in chains["no-spec@chain"]
    assert paired["phases"]["p"]["chains"]["goodput@chain"]["vs_goodput"]["blocks"] == 2
