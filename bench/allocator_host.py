"""Host time of the per-slot allocator per engine step (``SlotAllocator.decide_rows``, learning
included) at batch 1, 8 and 64: synthetic rows of mixed tasks with a full block of draft
confidence, histories growing as the allocator's k and random accepted runs dictate. Split as
the engine runs it: ``prepare_step`` (learning, priors, offsets: while the device drafts) and
``finish_step`` (the confidence's calibration, the budget, the bounds: between draft and
verify, the only part on the step's path).

Thread CPU time (other processes on the machine do not count), the batch sizes interleaved
over ``--repeats`` runs of ``--steps`` steps (the first 50 of each run dropped); per batch size
the median over runs of each run's median, and the best run. ``finish`` is timed as the
runner runs it between the confidence's copy to the host and the verify's launch
(``ModelRunner._allocated``: the float32 confidence tensor to per-row values, then
``finish_step``). In a two-phase step that time is spent while the device waits
(docs/allocator.md), so it adds to every step.

    .venv/bin/python bench/allocator_host.py > bench/results/allocator_host_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from engines.embedded.runner import ModelRunner
from policies.slot_allocator import AllocatorSettings, SlotAllocator
from policies.types import TASKS, StepRow

K = 15


class TokenCost:
    """A ragged step: 10 ms + 0.1 ms per row + 20 µs per draft (the shape of the 8B table)."""

    def step_time_s(self, batch_size: int, num_draft_tokens: int) -> float:
        return 0.01 + 1e-4 * batch_size + 2e-5 * num_draft_tokens


def one_run(batch: int, steps: int, seed: int) -> list[tuple[float, float]]:
    allocator = SlotAllocator(AllocatorSettings(K), TokenCost())
    rng = random.Random(seed)
    history: dict[int, tuple[list[int], list[int]]] = {i: ([], []) for i in range(batch)}
    times: list[tuple[float, float]] = []
    for _ in range(steps):
        # The draft's confidence as the device hands it over: one float32 [rows, K] tensor.
        confidence = torch.tensor([[rng.random() for _ in range(K)] for _ in range(batch)])
        rows = [StepRow(i, TASKS[i % 3], history[i][0], history[i][1], K) for i in range(batch)]
        started = time.thread_time()
        prepared = allocator.prepare_step(rows, batch, lambda task: [0.8] * K)
        middle = time.thread_time()
        chosen = ModelRunner._allocated(
            lambda values, prepared=prepared: allocator.finish_step(prepared, values).spec_tokens,
            confidence,
            [K] * batch,
        )
        times.append((middle - started, time.thread_time() - middle))
        for i, k in enumerate(chosen):
            lengths, ks = history[i]
            ks.append(k)
            lengths.append(1 + min(k, rng.randint(0, K)))
            if len(lengths) > 64:  # a request ends; the next one starts fresh
                lengths.clear()
                ks.clear()
    return times[50:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    batches = (1, 8, 64)
    runs: dict[int, list[tuple[float, float, float]]] = {b: [] for b in batches}
    for repeat in range(args.repeats):
        for batch in batches:
            parts = one_run(batch, args.steps, repeat)
            runs[batch].append(
                (
                    statistics.median(a + b for a, b in parts),
                    statistics.median(a for a, _ in parts),
                    statistics.median(b for _, b in parts),
                )
            )
    result = {
        "command": "python bench/allocator_host.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {platform.node()} (shared CPU)",
        "python": platform.python_version(),
        "clock": "thread CPU time",
        "steps": args.steps,
        "repeats": args.repeats,
        "us_per_step": {
            str(b): {
                "median": round(statistics.median(x[0] for x in v) * 1e6, 1),
                "best": round(min(x[0] for x in v) * 1e6, 1),
                "prepare_median": round(statistics.median(x[1] for x in v) * 1e6, 1),
                "finish_median": round(statistics.median(x[2] for x in v) * 1e6, 1),
                "finish_best": round(min(x[2] for x in v) * 1e6, 1),
            }
            for b, v in runs.items()
        },
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
