"""Host time per step of each policy's device-allocated path (issue 16): what the host does for
a two-phase step allocated on the device, goodput's allocator against vLLM's adaptive
verification, at the same batch.

Per step and policy: ``device_scoring`` (the next step's budget and scoring tables, made while
the previous step runs) and ``observed`` (learning from the step that ran, after its sync).
Synthetic rows of mixed tasks with a full block of random confidence, random k and accepted
runs; thread CPU time, policies interleaved over ``--repeats`` runs of ``--steps`` steps (the
first 50 of each dropped); per policy and part the median of each run's median.

On the H200 (docs/ragged-log.md "Session 22") goodput's 64-row device steps took 0.2-0.7 ms
more than vllm-av-device's beyond their extra tokens; this says how much of that the
policies' own host work could be.

    .venv/bin/python bench/device_path_host.py --out bench/results/device_path_host_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.baselines.vllm_av import VllmAdaptiveVerification, VllmAvSettings
from policies.slot_allocator import AllocatorSettings, SlotAllocator
from policies.slot_scoring import SlotScoring
from policies.types import TASKS, StepRow

K = 15
WARM_STEPS = 50


class Cost:
    """A 64-row H200-like ragged step: 15 ms plus 0.022 ms a token."""

    def step_time_s(self, batch_size: int, num_draft_tokens: int) -> float:
        return 0.015 + 2.2e-5 * (batch_size + num_draft_tokens)


Policy = tuple[
    Callable[[list[StepRow], list[tuple[float, ...]]], SlotScoring],
    Callable[[SlotScoring, list[tuple[float, ...]], list[int], list[int]], None],
]


def policy(name: str, batch: int) -> Policy:
    if name == "goodput":
        allocator = SlotAllocator(AllocatorSettings(K), Cost())

        def rates(task: object) -> list[float]:
            return [0.7] * K

        return (
            lambda rows, conf: allocator.device_scoring(rows, batch, rates, conf)[1],
            allocator.observed,
        )
    av = VllmAdaptiveVerification(VllmAvSettings(K), Cost(), Cost())
    av.prepare(batch)
    return (lambda rows, conf: av.device_scoring(rows, batch)[1], av.observed)


def one_run(name: str, batch: int, steps: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    score, observe = policy(name, batch)
    history: list[tuple[list[int], list[int]]] = [([], []) for _ in range(batch)]
    tasks = [TASKS[i % len(TASKS)] for i in range(batch)]
    confidence = [tuple(rng.uniform(0, 1, K)) for _ in range(batch)]
    scoring_s, observed_s = [], []
    for step in range(steps):
        rows = [StepRow(i, tasks[i], *history[i], K, confidence[i]) for i in range(batch)]
        started = time.thread_time()
        scoring = score(rows, confidence)
        scored = time.thread_time()
        ks = [int(k) for k in rng.integers(4, K + 1, batch)]
        lengths = [1 + int(rng.integers(0, k + 1)) for k in ks]
        confidence = [tuple(rng.uniform(0, 1, K)) for _ in range(batch)]
        learning = time.thread_time()
        observe(scoring, confidence, ks, lengths)
        learnt = time.thread_time()
        for (done, drafted), length, k in zip(history, lengths, ks, strict=True):
            done.append(length)
            drafted.append(k)
        if step >= WARM_STEPS:
            scoring_s.append(scored - started)
            observed_s.append(learnt - learning)
    return {
        "device_scoring_us": 1e6 * statistics.median(scoring_s),
        "observed_us": 1e6 * statistics.median(observed_s),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.steps <= WARM_STEPS:
        parser.error(f"--steps must be above the {WARM_STEPS} warm-up steps")
    names = ("goodput", "vllm-av")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        order = names if repeat % 2 == 0 else names[::-1]
        for name in order:
            runs[name].append(one_run(name, args.batch, args.steps, seed=repeat))
    summary: dict[str, Any] = {}
    for name, results in runs.items():
        parts = {key: [r[key] for r in results] for key in results[0]}
        summary[name] = {
            **{f"{key}_median": round(statistics.median(v), 1) for key, v in parts.items()},
            "total_us_median": round(statistics.median(sum(r.values()) for r in results), 1),
            "runs": results,
        }
    result = {
        "command": " ".join(["python", *sys.argv]),
        "machine": f"{platform.node()} {platform.machine()}",
        "batch": args.batch,
        "steps": args.steps,
        "repeats": args.repeats,
        "policies": summary,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    for name, figures in summary.items():
        print(
            f"{name:>8}: device_scoring {figures['device_scoring_us_median']:.0f} us, "
            f"observed {figures['observed_us_median']:.0f} us, "
            f"total {figures['total_us_median']:.0f} us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
