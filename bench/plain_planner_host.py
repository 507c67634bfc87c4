"""Host time the goodput planner adds to the engine's plain steps, on the host's critical path
(CPU, the forward taken out).

    .venv/bin/python bench/plain_planner_host.py --batch 1 --out bench/results/X.json

Where drafting does not pay, goodput runs plain steps as no-spec does, and the difference
between the two is the planner's host work. On the real pair (1 x H100, call s44a; a
host-bound 157 M target whose plain steps take 0.76 ms at one row and 1.45 ms at 64) goodput's
plain steps took 18 and 37 us longer than no-spec's (p50 of every run, 2.4-2.7%), and the
phases that ran plain came out 0.953-0.975x no-spec. Part of the planner's work runs while the
device runs the step (``Engine._overlap``: the last step's record, the next step's decision)
and is hidden there; the rest sits between two steps, where the device waits for it.

This bench builds the engine of ``bench/plain_step_host.py`` (a tiny pair whose width-1
verify returns a fixed result, so each call is host work only) and times engine calls of
plain bursts (``--burst`` steps, the CUDA default 4) with no planner (static k = 0: no-spec)
and with the goodput planner (``StepController``, a cost table where drafting never pays, so it
decides k = 0), in a seeded random order over ``--rounds`` rounds each. Per call: the wall time
and the time inside the overlap; the critical path is the difference (what a device would
wait for). Only calls that ran a whole plain burst count (goodput's first calls may probe).
Prints and writes the medians per step: critical path, overlap, total.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.plain_step_host import build_engine, write_result
from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams
from engines.embedded.request import Request
from engines.step_controller import FixedPolicySource, StepController
from policies.costmodel import CostTable
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec, PolicySpec
from policies.online import OnlineModels
from policies.types import Task

# Drafting a hundred times a plain step's price: goodput decides k = 0 throughout.
NEVER_DRAFTS = CostTable((1, 64), (1, 16), ((0.001, 0.1), (0.002, 0.2)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--batch", type=int, default=1, help="rows decoding together")
    parser.add_argument("--burst", type=int, default=4, help="plain steps a call (default 4)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per variant (default 6)")
    parser.add_argument("--tokens", type=int, default=400, help="tokens a row decodes a round")
    parser.add_argument("--seed", default="0", help="seed of the rounds' order")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.batch < 1 or args.tokens < 2 * args.burst:
        parser.error("--rounds and --batch must be >= 1, --tokens >= 2 x --burst")
    if not 1 <= args.burst <= 16:
        parser.error("--burst: from 1 to 16")
    return args


def goodput_planner(block_size: int) -> StepController:
    spec = GoodputSpec()
    models = OnlineModels(spec, block_size, NEVER_DRAFTS, 1)
    source = FixedPolicySource(
        PolicySpec(kind="goodput", goodput=spec), GoodputPolicy(spec), models
    )
    return StepController(source, block_size, random.Random(0), ragged=True)


class OverlapClock:
    """Wraps ``engine._overlap`` and adds up the seconds spent in it."""

    def __init__(self, engine: Engine) -> None:
        self.seconds = 0.0
        self._inner = engine._overlap
        engine._overlap = self  # type: ignore[method-assign]

    def __call__(self) -> None:
        started = time.perf_counter()
        self._inner()
        self.seconds += time.perf_counter() - started


def one_round(
    engine: Engine,
    clock: OverlapClock,
    planner: StepController | None,
    name: str,
    args: argparse.Namespace,
) -> dict[str, float]:
    """Medians per step over the round's whole plain-burst calls (microseconds)."""
    engine.planner = planner
    for row in range(args.batch):
        controller = planner.start(Task.MATH, 1.0, 0) if planner else (lambda view: 0)
        prompt = list(range(5, 40))
        params = SamplingParams(max_new_tokens=args.tokens)
        engine.add(Request(f"{name}-{row}", prompt, params, controller, {}))
    engine.step()  # the prefills and the first tokens
    critical, overlap, total = [], [], []
    while engine.has_work:
        drafted = engine.step_counts["drafting"].steps
        plain = engine.step_counts["plain"].steps
        clock.seconds = 0.0
        started = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - started
        steps = engine.step_counts["plain"].steps - plain
        if engine.step_counts["drafting"].steps == drafted and steps == args.burst:
            critical.append(1e6 * (wall - clock.seconds) / steps)
            overlap.append(1e6 * clock.seconds / steps)
            total.append(1e6 * wall / steps)
    if not total:
        raise RuntimeError(f"round {name}: no whole plain burst to time")
    return {
        "critical_us": statistics.median(critical),
        "overlap_us": statistics.median(overlap),
        "total_us": statistics.median(total),
        "calls": len(total),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    order = ["no-spec", "goodput"] * args.rounds
    random.Random(args.seed).shuffle(order)
    rounds: dict[str, list[dict[str, float]]] = {"no-spec": [], "goodput": []}
    with tempfile.TemporaryDirectory() as folder:
        engine = build_engine(Path(folder), 64 + args.tokens, args.batch)
        engine.runner.plain_fast_path = True
        engine.plain_burst = args.burst
        clock = OverlapClock(engine)
        planner = goodput_planner(engine.block_size)
        one_round(engine, clock, None, "warm-a", args)
        one_round(engine, clock, planner, "warm-b", args)
        for index, name in enumerate(order):
            rounds[name].append(
                one_round(engine, clock, planner if name == "goodput" else None, f"r{index}", args)
            )
    summary: dict[str, Any] = {}
    for name, values in rounds.items():
        summary[name] = {
            key: round(statistics.median(v[key] for v in values), 2)
            for key in ("critical_us", "overlap_us", "total_us")
        }
        summary[name]["critical_us_range"] = [
            round(min(v["critical_us"] for v in values), 2),
            round(max(v["critical_us"] for v in values), 2),
        ]
    summary["goodput_critical_extra_us"] = round(
        summary["goodput"]["critical_us"] - summary["no-spec"]["critical_us"], 2
    )
    fields = {"order": order, "rounds": rounds}
    write_result(args, "bench/plain_planner_host.py", argv, fields, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
