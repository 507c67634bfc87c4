"""bench/confidence_joint.py and bench/survival_replay.py: the joint structure of a block's
confidences and the policies' online slot scores (CPU, synthetic steps and a written raw file)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.confidence_joint import Steps, evaluate, load, structure, synthetic_steps
from bench.confidence_joint import main as joint_main
from bench.survival_replay import TaskRates, allocator_scorer, interleaved, replay, vllm_scorer
from bench.survival_replay import main as replay_main
from policies.slot_allocator import AllocatorSettings
from policies.types import StepRow


@pytest.fixture(scope="module")
def steps() -> Steps:
    return synthetic_steps("realistic", requests=24, steps=12, seed=3)


def test_synthetic_steps_are_in_request_order_with_their_own_history(steps: Steps) -> None:
    k = steps.conf.shape[1]
    assert steps.conf.shape == (3 * 24 * 12, k) and k == 15
    # each request's 12 steps are contiguous
    changes = np.flatnonzero(np.diff(steps.prompt)) + 1
    lengths = np.diff(np.r_[0, changes, len(steps.prompt)])
    assert len(changes) == 3 * 24 - 1 and (lengths == 12).all()
    history, seen = steps.history
    first = np.r_[0, changes]
    assert (seen[first] == 0).all() and (history[first] == 0).all()
    # the second step's history is the first step's run / k
    assert np.allclose(history[first + 1], steps.run[first] / k)


def test_the_synthetic_model_makes_later_positions_look_like_rejections(steps: Steps) -> None:
    """docs/synthetic.md: confidence is drawn from survival, so every position after the
    first rejection is drawn like a rejection (what bench/confidence_joint.py compares with
    a real pair's)."""
    s = structure(steps.conf, steps.run)
    gap = s["accepted"]["mean_logit"] - s["first_rejection"]["mean_logit"]
    assert gap > 0.8
    assert abs(s["after_rejection"]["mean_logit"] - s["first_rejection"]["mean_logit"]) < 0.2


def test_every_estimator_beats_chance_and_none_beats_the_oracle(steps: Steps) -> None:
    result = evaluate(steps)
    for name in ("prefix", "prefix+task+history", "block", "prefix-run"):
        figures = result[name]
        assert figures["auc_survival"] > 0.8
        for key, oracle in result["oracle"].items():
            assert figures[key] <= oracle + 1e-9


def test_the_run_posterior_reads_the_synthetic_models_survival_structure(steps: Steps) -> None:
    """``prefix-run`` (the exact prefix posterior of the run's length, fitted) ranks the
    synthetic model's slots better than vLLM's per-position form, which reads each position's
    confidence as about that position alone: the structure the model draws confidence from
    (on the recorded testbed pair it ranks worse: bench/results/confidence_joint_*.json)."""
    result = evaluate(steps)
    at_budget = "survivors_per_slot_at_1x"
    assert result["prefix-run"][at_budget] > result["prefix"][at_budget] + 0.02
    assert result["prefix-run"]["log_loss"] < result["prefix"]["log_loss"]


def test_a_raw_file_round_trips_and_the_command_writes_its_json(tmp_path: Path) -> None:
    raw = tmp_path / "raw.jsonl.gz"
    rng = np.random.default_rng(0)
    with gzip.open(raw, "wt") as f:
        for prompt in range(8):
            for step in range(6):
                run = int(rng.integers(0, 8))
                conf = [0.9 if j < run else 0.2 for j in range(7)]
                conf = [min(0.99, max(0.01, c + rng.normal(0, 0.3))) for c in conf]
                task = ("math", "code", "chat")[prompt % 3]
                line = {"task": task, "prompt": prompt, "step": step, "confidence": conf}
                f.write(json.dumps(line | {"accept_length": run + 1}) + "\n")
    loaded = load(raw)
    assert loaded.conf.shape == (48, 7) and loaded.run.max() <= 7
    out = tmp_path / "joint.json"
    assert joint_main([str(raw), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["positions"] == 7 and report["measured"]["steps"] == 48
    assert set(report["tasks"]) == {"math", "code", "chat"}
    out = tmp_path / "replay.json"
    assert replay_main([str(raw), "--rows", "4", "--out", str(out)]) == 0
    assert set(json.loads(out.read_text())["policies"]) == {
        "allocator",
        "allocator-no-history",
        "allocator-no-recency",
        "vllm-av",
    }


def test_the_allocators_online_scores_rank_synthetic_slots_better_than_vllms(steps: Steps) -> None:
    """The allocator knows the task and the request's history; vLLM's estimator reads the
    confidence alone. On the synthetic model (where both carry information) it must rank
    the slots better."""
    k = steps.conf.shape[1]
    result = replay(
        steps,
        24,
        {
            "allocator": allocator_scorer(AllocatorSettings(max_spec_tokens=k)),
            "vllm-av": vllm_scorer(k),
        },
    )
    assert result["allocator"]["auc_survival"] > result["vllm-av"]["auc_survival"]
    assert result["allocator"]["survivors_per_slot_at_1x"] <= 1.0


def test_censored_task_rates_count_only_the_positions_a_verify_labels() -> None:
    rates = TaskRates(7)
    rates.observe_censored("math", 5, 2)  # verified 2 of a run of 5: both accepted
    assert rates.trials["math"].tolist() == [1, 1, 0, 0, 0, 0, 0]
    assert rates.hits["math"].tolist() == [1, 1, 0, 0, 0, 0, 0]
    rates.observe_censored("math", 1, 4)  # the first rejection at position 1 is labelled
    assert rates.trials["math"].tolist() == [2, 2, 0, 0, 0, 0, 0]
    assert rates.hits["math"].tolist() == [2, 1, 0, 0, 0, 0, 0]
    rates.observe_censored("math", 3, 0)  # drafting off: nothing
    assert rates.trials["math"].sum() == 4
    wide, censored = TaskRates(7), TaskRates(7)
    for run in range(8):
        wide.observe("code", run)
        censored.observe_censored("code", run, 7)
    assert (wide.trials["code"] == censored.trials["code"]).all()
    assert (wide.hits["code"] == censored.hits["code"]).all()


def test_closed_loop_histories_record_only_the_allocated_slots() -> None:
    """Round 0: request 0 runs 5, request 1 runs 0, so D = 5 at 1x; the scorer ranks
    request 1's first three slots above request 0's first two, so request 0 verifies k = 2
    (accept length 3, spec_tokens 2) and request 1 k = 3 (accept length 1). Open loop
    records k = 7 and the whole run."""
    k = 7
    steps = Steps(
        np.full((4, k), 0.5),
        np.array([5, 1, 0, 2]),
        np.array([0, 0, 1, 1]),
        np.array(["math", "math", "code", "code"]),
    )
    fixed: dict[Hashable, list[float]] = {
        0: [0.6, 0.5, 0.05, 0.04, 0.03, 0.02, 0.01],
        1: [0.9, 0.8, 0.7, 0.01, 0.01, 0.01, 0.0],
    }

    def run(closed: bool) -> tuple[list[dict[Hashable, tuple[list[int], list[int]]]], Any]:
        seen: list[dict[Hashable, tuple[list[int], list[int]]]] = []

        def scorer(rows: list[StepRow], rates: Any) -> np.ndarray:
            seen.append({r.row_id: (list(r.accept_lengths), list(r.spec_tokens)) for r in rows})
            return np.array([fixed[r.row_id] for r in rows])

        return seen, replay(steps, 2, {"fixed": scorer}, closed_loop=closed)

    seen, result = run(closed=True)
    assert seen[0] == {0: ([], []), 1: ([], [])}
    assert seen[1] == {0: ([3], [2]), 1: ([1], [3])}
    # round 1: runs 1 and 2, D = 3, all request 1's (k = 3, accepts 2), request 0 k = 0
    assert result["fixed"]["accepted_per_round"] == (2 + 2) / 2
    assert result["fixed"]["verified_per_round"] == (5 + 3) / 2
    assert result["oracle"]["verified_per_round"] == (5 + 3) / 2
    seen, result = run(closed=False)
    assert seen[1] == {0: ([6], [k]), 1: ([1], [k])}
    assert "accepted_per_round" not in result["fixed"] and "oracle" not in result


def test_pipelined_scores_on_the_device_path_with_the_histories_a_round_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps = synthetic_steps("realistic", requests=2, steps=4, seed=0)
    k = steps.conf.shape[1]
    allocator, vllm = allocator_scorer(AllocatorSettings(max_spec_tokens=k)), vllm_scorer(k)
    events: list[str] = []
    calls: dict[str, list[tuple[list[StepRow], object]]] = {"allocator": [], "vllm-av": []}
    observed: list[tuple[list[int], list[int]]] = []

    def spy(name: str, device_scoring: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(rows: list[StepRow], batch_size: int, *args: Any) -> Any:
            snapshot = [
                r._replace(accept_lengths=list(r.accept_lengths), spec_tokens=list(r.spec_tokens))
                for r in rows
            ]
            calls[name].append((snapshot, args[-1] if args else None))
            events.append(f"{name}:score")
            return device_scoring(rows, batch_size, *args)

        return wrapped

    def host_path(*args: object) -> None:
        raise AssertionError("the pipelined replay scores on the device path")

    real_observed = allocator.allocator.observed

    def spy_observed(
        scoring: Any, confidence: Any, spec_tokens: list[int], accept_lengths: list[int]
    ) -> None:
        events.append("allocator:observed")
        observed.append((list(spec_tokens), list(accept_lengths)))
        real_observed(scoring, confidence, spec_tokens, accept_lengths)

    monkeypatch.setattr(
        allocator.allocator, "device_scoring", spy("allocator", allocator.allocator.device_scoring)
    )
    monkeypatch.setattr(allocator.allocator, "observed", spy_observed)
    monkeypatch.setattr(allocator.allocator, "prepare_step", host_path)
    monkeypatch.setattr(vllm.policy, "device_scoring", spy("vllm-av", vllm.policy.device_scoring))
    monkeypatch.setattr(vllm.policy, "_learn", host_path)
    result = replay(steps, 6, {"allocator": allocator, "vllm-av": vllm}, pipelined=True)
    assert "accepted_per_round" in result["allocator"]
    # one group of 6 requests, 4 rounds; round t's scoring is made before round t - 1's
    # outcome is learnt, and the last round's outcome is learnt at the end
    allocator_events = [e for e in events if e.startswith("allocator")]
    assert allocator_events == [
        "allocator:score",
        "allocator:score",
        "allocator:observed",
        "allocator:score",
        "allocator:observed",
        "allocator:score",
        "allocator:observed",
        "allocator:observed",
    ]
    first = [np.flatnonzero(steps.prompt == p)[0] for p in range(6)]
    for name in ("allocator", "vllm-av"):
        assert len(calls[name]) == 4
        for t, (rows, previous) in enumerate(calls[name]):
            # the histories lack round t - 1: round t - 2's is the newest
            assert all(len(r.accept_lengths) == len(r.spec_tokens) == max(0, t - 1) for r in rows)
            # the budget reads the confidence of round t - 1
            given = previous if name == "allocator" else [r.draft_confidence for r in rows]
            assert given is not None
            for r, c in zip(rows, given, strict=True):
                if t == 0:
                    assert c is None
                else:
                    assert np.array_equal(c, steps.conf[first[int(r.row_id)] + t - 1])
    # the stale history of round 2 holds round 0's censored outcome as the device ran it
    spec_tokens, accept_lengths = observed[0]
    rows = calls["allocator"][2][0]
    assert [r.spec_tokens[0] for r in rows] == spec_tokens
    assert [r.accept_lengths[0] for r in rows] == accept_lengths
    runs = steps.run[first]
    assert accept_lengths == (np.minimum(runs, spec_tokens) + 1).tolist()
    assert sum(spec_tokens) == int(runs.sum())  # D = the round's survivors at 1x


@pytest.mark.parametrize("mode", ["--closed-loop", "--pipelined"])
def test_the_replay_command_runs_closed_loop_and_pipelined(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "replay.json"
    argv = ["--synthetic", "realistic", "--requests", "3", "--steps", "4", "--rows", "5"]
    assert replay_main([*argv, mode, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["mode"] == mode.removeprefix("--")
    policies = report["policies"]
    oracle = policies.pop("oracle")
    bounded = policies.pop("allocator-min4")  # k in {0} U [4, K]: may leave slots unused
    assert set(policies) == {"allocator", "allocator-no-history", "allocator-no-recency", "vllm-av"}
    for figures in policies.values():
        assert 0 < figures["accepted_per_round"] <= figures["verified_per_round"]
        assert figures["verified_per_round"] == oracle["verified_per_round"]
        assert figures["survivors_per_slot_at_1x"] <= 1.0
    assert bounded["accepted_per_round"] <= bounded["verified_per_round"]
    assert bounded["verified_per_round"] <= oracle["verified_per_round"]


def test_the_device_path_host_bench_times_both_policies(tmp_path: Path) -> None:
    from bench.device_path_host import main as host_main

    out = tmp_path / "host.json"
    assert host_main(["--batch", "8", "--steps", "60", "--repeats", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["policies"]) == {"goodput", "vllm-av"}
    for figures in report["policies"].values():
        assert len(figures["runs"]) == 2
        assert figures["device_scoring_us_median"] > 0 and figures["observed_us_median"] > 0


def test_a_bounded_allocator_verifies_zero_or_at_least_its_minimum(steps: Steps) -> None:
    """Closed loop, ``allocator-min4``: every row's k is 0 or >= 4 (the goodput policy's
    default bounds, within the round's D slots); the unbounded allocator takes any k."""
    from bench.survival_replay import AllocatorScorer

    k = steps.conf.shape[1]
    seen: dict[str, list[int]] = {"bounded": [], "any": []}

    class Spy(AllocatorScorer):
        def __init__(self, name: str, bounded: bool):
            super().__init__(AllocatorSettings(max_spec_tokens=k), bounded=bounded)
            self.name = name

        def __call__(self, rows, rates):  # type: ignore[no-untyped-def]
            for r in rows:
                if r.spec_tokens:
                    seen[self.name].append(r.spec_tokens[-1])
            return super().__call__(rows, rates)

    replay(steps, 6, {"b": Spy("bounded", True), "a": Spy("any", False)}, closed_loop=True)
    assert seen["bounded"] and all(x == 0 or x >= 4 for x in seen["bounded"])
    assert any(0 < x < 4 for x in seen["any"])


def test_interleaved_batches_mix_the_tasks(tmp_path: Path) -> None:
    assert interleaved([0, 1, 2, 3, 4], ["a", "a", "a", "b", "c"]) == [0, 3, 4, 1, 2]
    out = tmp_path / "replay.json"
    argv = ["--synthetic", "realistic", "--requests", "4", "--steps", "3", "--rows", "6"]
    assert replay_main([*argv, "--closed-loop", "--interleave", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["interleaved"] is True
    assert 0 < report["policies"]["allocator"]["accepted_per_round"]
