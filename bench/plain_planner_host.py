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

With ``--device cuda`` the forward stays in: a random pair of the real pair's shape
(training/configs/testbed.yaml: a 157 M target, hidden 1024, 12 layers; a 3-layer block-16
draft) with the engine's CUDA defaults (CUDA graphs, Triton attention, fused linears, the
draft's context stashed at k = 0, plain bursts of 4), so the same comparison runs where the
device waits for the host (s44a's and s45c's +17-18 us a plain step at one row). Per call it
also splits the critical path: the time until the burst is queued (the planner's ``plan``
included), and the sync's wait for the device. ``wait_us`` falls by what the host adds to
its overlap and rises by what the device idles elsewhere; ``decide_us`` is the engine's
``_spec_tokens`` (the rows' views and the planner's ``plan``, before anything is queued),
``after_us`` the host's work after the sync; ``total_us`` is what a phase pays.

``--chain`` adds both policies with chained plain bursts (``Engine(plain_chain=True)``: each
burst queued before the last one is read, so the host's work after a sync and before the
next launch overlaps the device), in the same shuffled order: ``*_chain_saves_us`` is what
chaining takes off a step. ``tokens_agree``: every round that ran plain throughout decoded
the same greedy prompts to the same tokens (a check of the chain on the device; with the
forward taken out, on the CPU, every token is the same anyway). A goodput round whose planner
drafted (``drafting_steps``: a probe of a width) is left out of it: a verify of several tokens
takes other GEMM shapes, whose bf16 sums may pick another argmax where two logits nearly tie
on this random pair (session 46's first goodput round did); ``tokens_agree_rounds`` says how
many rounds it compared.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.plain_step_host import build_engine, write_result
from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from engines.step_controller import FixedPolicySource, StepController
from policies.costmodel import CostTable
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec, PolicySpec
from policies.online import OnlineModels
from policies.types import Task
from tests.tinymodels import write_tiny_pair

# What a round times per step, by device (cuda adds the critical path's split).
ROUND_KEYS = {
    "cpu": ("critical_us", "overlap_us", "total_us"),
    "cuda": (
        "critical_us",
        "overlap_us",
        "total_us",
        "queue_us",
        "wait_us",
        "decide_us",
        "after_us",
    ),
}
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
    parser.add_argument(
        "--chain",
        action="store_true",
        help="also run both with chained plain bursts (Engine(plain_chain=True): each burst "
        "queued before the last one is read), as no-spec-chain and goodput-chain",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="cpu: the forward taken out (default); cuda: a random pair of the real pair's "
        "shape on the engine's CUDA defaults",
    )
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
    """Wraps ``engine._overlap`` and adds up the seconds spent in it; with ``sync`` also the
    runner's ``_plain_sync`` (the overlap, then the wait for the device's tokens) and when it
    was first entered in the call (``queued``: the burst is on the device by then)."""

    def __init__(self, engine: Engine, sync: bool = False) -> None:
        self.seconds = 0.0
        self.sync_s = 0.0
        self.decide_s = 0.0  # in ``Engine._spec_tokens`` (the views, the planner's ``plan``)
        self.queued: float | None = None
        self._inner = engine._overlap
        engine._overlap = self  # type: ignore[method-assign]
        if sync:
            runner = engine.runner
            # the sync (a plain burst's, or a chained one's read), the first entered in a call
            runner._plain_sync = self._timed(runner._plain_sync, "sync_s", first=True)  # type: ignore[method-assign]
            runner.plain_collect = self._timed(runner.plain_collect, "sync_s", first=True)  # type: ignore[method-assign]
            engine._spec_tokens = self._timed(engine._spec_tokens, "decide_s")  # type: ignore[method-assign]

    def _timed(self, inner: Callable[..., Any], total: str, first: bool = False) -> Any:
        """``inner`` adding its seconds to the attribute ``total`` (``first``: its start kept
        in ``queued`` when it is the call's first such entry)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            if first and self.queued is None:
                self.queued = started
            try:
                return inner(*args, **kwargs)
            finally:
                setattr(self, total, getattr(self, total) + time.perf_counter() - started)

        return timed

    def reset(self) -> None:
        self.seconds, self.sync_s, self.decide_s, self.queued = 0.0, 0.0, 0.0, None

    def __call__(self) -> None:
        started = time.perf_counter()
        self._inner()
        self.seconds += time.perf_counter() - started


def build_device_engine(folder: Path, max_seq_len: int, batch: int, burst: int) -> Engine:
    """A random pair of the real pair's shape (training/configs/testbed.yaml) on CUDA with
    the engine's defaults there (``EmbeddedConfig``: CUDA graphs, Triton attention, fused
    linears, the draft's context stashed at k = 0); plain bursts of ``burst``."""
    target, draft = write_tiny_pair(
        folder,
        block_size=16,
        vocab_size=6144,
        hidden_size=1024,
        intermediate_size=3072,
        num_target_layers=12,
        num_draft_layers=3,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
    )
    runner = load_runner(
        target,
        draft,
        torch.device("cuda"),
        batch,
        max_seq_len,
        attention="triton",
        linear="fused",
        defer_context=True,
    )
    return Engine(runner, batch, max_seq_len, plain_burst=burst)


def one_round(
    engine: Engine,
    clock: OverlapClock,
    planner: StepController | None,
    name: str,
    args: argparse.Namespace,
) -> dict[str, float]:
    """Medians per step over the round's whole plain-burst calls (microseconds), and a
    checksum of the rows' tokens (``tokens_crc``: every round decodes the same greedy
    prompts, so every variant's must agree)."""
    engine.planner = planner
    engine.plain_chain = name.endswith("-chain")
    requests = []
    for row in range(args.batch):
        controller = planner.start(Task.MATH, 1.0, 0) if planner else (lambda view: 0)
        prompt = list(range(5, 40))
        params = SamplingParams(max_new_tokens=args.tokens)
        requests.append(Request(f"{name}-{row}", prompt, params, controller, {}))
        engine.add(requests[-1])
    engine.step()  # the prefills and the first tokens
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.synchronize()
    timed: dict[str, list[float]] = {key: [] for key in ROUND_KEYS[args.device]}
    drafting_before = engine.step_counts["drafting"].steps
    while engine.has_work:
        drafted = engine.step_counts["drafting"].steps
        plain = engine.step_counts["plain"].steps
        clock.reset()
        started = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - started
        steps = engine.step_counts["plain"].steps - plain
        if engine.step_counts["drafting"].steps != drafted or steps != args.burst:
            continue
        timed["overlap_us"].append(1e6 * clock.seconds / steps)
        timed["total_us"].append(1e6 * wall / steps)
        if not cuda:
            timed["critical_us"].append(1e6 * (wall - clock.seconds) / steps)
            continue
        # until the burst is queued; the sync's wait for the device (its overlap left out);
        # the critical path: every host second outside the overlap and that wait
        queued = (clock.queued or started) - started
        wait = clock.sync_s - clock.seconds
        timed["queue_us"].append(1e6 * queued / steps)
        timed["wait_us"].append(1e6 * wait / steps)
        timed["critical_us"].append(1e6 * (wall - clock.seconds - wait) / steps)
        timed["decide_us"].append(1e6 * clock.decide_s / steps)
        timed["after_us"].append(1e6 * (wall - queued - clock.sync_s) / steps)
    if not timed["total_us"]:
        raise RuntimeError(f"round {name}: no whole plain burst to time")
    medians: dict[str, float] = {k: statistics.median(v) for k, v in timed.items()}
    tokens = [t for request in requests for t in request.output_ids]
    crc = zlib.crc32(",".join(map(str, tokens)).encode())
    drafting = engine.step_counts["drafting"].steps - drafting_before
    return {
        **medians,
        "calls": len(timed["total_us"]),
        "drafting_steps": drafting,
        "tokens_crc": crc,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    names = ["no-spec", "goodput"] + (["no-spec-chain", "goodput-chain"] if args.chain else [])
    order = names * args.rounds
    random.Random(args.seed).shuffle(order)
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as folder:
        if args.device == "cuda":
            engine = build_device_engine(Path(folder), 64 + args.tokens, args.batch, args.burst)
        else:
            engine = build_engine(Path(folder), 64 + args.tokens, args.batch)
            engine.runner.plain_fast_path = True
            engine.plain_burst = args.burst
        clock = OverlapClock(engine, sync=args.device == "cuda")
        planner = goodput_planner(engine.block_size)
        one_round(engine, clock, None, "warm-a", args)
        one_round(engine, clock, planner, "warm-b", args)
        for index, name in enumerate(order):
            rounds[name].append(
                one_round(
                    engine,
                    clock,
                    planner if name.startswith("goodput") else None,
                    f"r{index}-{name}",
                    args,
                )
            )
    summary: dict[str, Any] = {}
    for name, values in rounds.items():
        summary[name] = {
            key: round(statistics.median(v[key] for v in values), 2)
            for key in ROUND_KEYS[args.device]
        }
        summary[name]["critical_us_range"] = [
            round(min(v["critical_us"] for v in values), 2),
            round(max(v["critical_us"] for v in values), 2),
        ]
    # every round decoded the same greedy prompts: the same tokens, chained or not
    plain_rounds = [r for rs in rounds.values() for r in rs if not r["drafting_steps"]]
    summary["tokens_agree"] = len({r["tokens_crc"] for r in plain_rounds}) == 1
    summary["tokens_agree_rounds"] = len(plain_rounds)
    for key in ("critical", "total"):
        summary[f"goodput_{key}_extra_us"] = round(
            summary["goodput"][f"{key}_us"] - summary["no-spec"][f"{key}_us"], 2
        )
    if args.chain:
        summary["goodput_chain_total_extra_us"] = round(
            summary["goodput-chain"]["total_us"] - summary["no-spec-chain"]["total_us"], 2
        )
        for name in ("no-spec", "goodput"):  # what chaining saves a step
            summary[f"{name}_chain_saves_us"] = round(
                summary[name]["total_us"] - summary[f"{name}-chain"]["total_us"], 2
            )
    fields = {"order": order, "rounds": rounds}
    write_result(args, "bench/plain_planner_host.py", argv, fields, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
