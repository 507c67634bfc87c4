"""Host time of the engine's plain (k = 0, greedy) decode step, fast path against the general
step, with the forward taken out (CPU).

    .venv/bin/python bench/plain_step_host.py --out bench/results/plain_step_host_cpu.json
        [--batch 64]

At batch 1 on a GPU the host work between two plain steps is device idle time (the engine
step at k = 0 was 1.44x the weight-read floor on the H200 where the forward alone was 1.28x;
README, issue 16). This bench isolates that host work on any machine: a tiny random pair
(tests/tinymodels.py) in a graph runner (static calls on the CPU) whose width-1 verify call
returns a fixed result, so each ``Engine.step`` is the engine's and the runner's own Python
and small-tensor work. ``ModelRunner.plain_fast_path`` on (``_plain_step``) and off
(the general step), alternating in a seeded random order over ``--rounds`` rounds each;
median and spread of microseconds per step. Writes JSON with the command.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from tests.tinymodels import write_tiny_pair


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per variant (default 6)")
    parser.add_argument("--tokens", type=int, default=500, help="plain steps per round")
    parser.add_argument("--seed", default="0", help="seed of the rounds' order")
    parser.add_argument(
        "--batch", type=int, default=1, help="requests decoding together (default 1)"
    )
    parser.add_argument(
        "--burst",
        type=int,
        default=1,
        help="compare the fast path one step a call against plain bursts of this many steps "
        "(Engine.plain_burst) instead of the fast path against the general step (default 1: "
        "the latter)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.tokens < 2 or args.batch < 1:
        parser.error("--rounds and --batch must be >= 1 and --tokens >= 2")
    if not 1 <= args.burst <= 16:
        parser.error("--burst: from 1 to 16")
    return args


def build_engine(folder: Path, max_seq_len: int, batch: int = 1) -> Engine:
    target, draft = write_tiny_pair(folder, block_size=8, seed=0)
    runner = load_runner(
        target,
        draft,
        torch.device("cpu"),
        batch,
        max_seq_len,
        use_cuda_graphs=True,
        attention="sdpa",
    )
    for size in runner.batch_sizes:  # every width-1 verify the batch can replay
        plain = runner._graphs["verify", size, 1]
        zeros = torch.zeros(size, 1, dtype=torch.long)
        fixed = plain(zeros, zeros).clone()

        class FixedCall:  # the forward taken out: what is left is host work
            def __init__(self, out: torch.Tensor) -> None:
                self.out = out

            def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
                return self.out

        runner._graphs["verify", size, 1] = FixedCall(fixed)  # type: ignore[assignment]
    return Engine(runner, batch, max_seq_len)


def one_round(engine: Engine, fast: bool, tokens: int, batch: int = 1, burst: int = 1) -> float:
    """Microseconds per plain step of ``batch`` requests decoding ``tokens`` tokens each
    (``burst``: the engine's ``plain_burst``; a call's steps counted from its reports)."""
    engine.runner.plain_fast_path = fast
    engine.plain_burst = burst
    for row in range(batch):
        engine.add(
            Request(
                f"plain{row}",
                list(range(5, 40)),
                SamplingParams(max_new_tokens=tokens),
                lambda view: 0,
                {},
            )
        )
    engine.step()  # the prefills and the first tokens
    reports = 0  # one per row per step
    started = time.perf_counter()
    while engine.has_work:
        reports += sum(1 for _, e in engine.step() if getattr(e, "report", None) is not None)
    return 1e6 * (time.perf_counter() - started) / (reports / batch)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    order = [True, False] * args.rounds
    random.Random(args.seed).shuffle(order)
    # --burst N: "fast" is the fast path one step a call, "general" becomes "burst" (N).
    other = "general" if args.burst == 1 else "burst"
    runs: dict[str, list[float]] = {"fast": [], other: []}
    with tempfile.TemporaryDirectory() as folder:
        engine = build_engine(Path(folder), 64 + args.tokens, args.batch)
        one_round(engine, True, 8, args.batch)  # warm-up
        for first in order:
            if args.burst == 1:
                steps = one_round(engine, first, args.tokens, args.batch)
            else:
                steps = one_round(engine, True, args.tokens, args.batch, 1 if first else args.burst)
            runs["fast" if first else other].append(steps)
    summary: dict[str, Any] = {
        name: {
            "median_us": round(statistics.median(values), 1),
            "mean_us": round(statistics.fmean(values), 1),
            "min_us": round(min(values), 1),
            "max_us": round(max(values), 1),
            "rounds_us": [round(v, 1) for v in values],
        }
        for name, values in runs.items()
    }
    summary[f"fast_over_{other}_median"] = round(
        summary["fast"]["median_us"] / summary[other]["median_us"], 3
    )
    order_names = ["fast" if f else other for f in order]
    write_result(args, "bench/plain_step_host.py", argv, {"order": order_names}, summary)
    return 0


def write_result(
    args: argparse.Namespace,
    script: str,
    argv: list[str] | None,
    fields: dict[str, Any],
    summary: dict[str, Any],
) -> None:
    """The host benches' JSON (the command, the machine, ``--batch`` and ``--burst``, then
    ``fields`` and the summary) to ``args.out``; the summary printed."""
    result = {
        "command": " ".join([script, *(argv if argv is not None else sys.argv[1:])]),
        "machine": (
            torch.cuda.get_device_name() if getattr(args, "device", "cpu") == "cuda" else "cpu"
        ),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "batch": args.batch,
        "burst": args.burst,
        **fields,
        "summary": summary,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
