"""bench/confidence_joint.py and bench/survival_replay.py: the joint structure of a block's
confidences and the policies' online slot scores (CPU, synthetic steps and a written raw file)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from bench.confidence_joint import Steps, evaluate, load, structure, synthetic_steps
from bench.confidence_joint import main as joint_main
from bench.survival_replay import allocator_scorer, replay, vllm_scorer
from bench.survival_replay import main as replay_main
from policies.slot_allocator import AllocatorSettings


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
    for name in ("prefix", "prefix+task+history", "block"):
        figures = result[name]
        assert figures["auc_survival"] > 0.8
        for key, oracle in result["oracle"].items():
            assert figures[key] <= oracle + 1e-9


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


def test_the_device_path_host_bench_times_both_policies(tmp_path: Path) -> None:
    from bench.device_path_host import main as host_main

    out = tmp_path / "host.json"
    assert host_main(["--batch", "8", "--steps", "60", "--repeats", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["policies"]) == {"goodput", "vllm-av"}
    for figures in report["policies"].values():
        assert len(figures["runs"]) == 2
        assert figures["device_scoring_us_median"] > 0 and figures["observed_us_median"] > 0
