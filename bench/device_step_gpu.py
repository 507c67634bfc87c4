"""Where a device-allocated two-phase step spends its time (issue 16): one call that times, per
batch size, a one-phase ragged step against a two-phase step allocated on the device (and on
the host) that verifies the same number of tokens, and splits each step's wall time into the
GPU's busy time (the sum of its kernels, from the profiler) and the time the GPU waited.

On the H200 (session 20's warm calls) a device-allocated 64-row step verifying ~400 tokens took
24.7-25.2 ms where the start-up profile prices a one-phase step of those tokens at ~21-22 ms,
and a 1-row one 9.67 ms against 8.92 one-phase: this says how much of that is the whole-block
draft, the allocation's kernels, and the host keeping the GPU waiting.

Greedy rows over a random-weight Qwen3 shape (the engine's own CUDA graphs, Triton attention by
default); rows do not advance, so every repeat runs the same step.

    python3 bench/device_step_gpu.py --out $OUT/device_step.json            # H200
    # session 51 (H100): where the extra time goes, and the fused argmax / confidence
    python3 bench/device_step_gpu.py --compile-scope layer --rows 64:7,8:8 --also-k '' \
        --split-widths --out $OUT/device_step_split.json
    python3 bench/device_step_gpu.py --compile-scope layer --rows 64:7,8:8,1:15 --also-k '' \
        --top1 --out $OUT/device_step_top1.json
    python3 bench/device_step_gpu.py --device cpu --tiny --out /tmp/d.json   # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.ragged_gpu_check import BLOCK, Bench  # noqa: E402
from bench.ragged_gpu_check import parse_args as check_args  # noqa: E402
from bench.step_breakdown_gpu import timed_ms  # noqa: E402
from engines.embedded.events import COMPILE_SCOPES  # noqa: E402
from engines.embedded.ragged import padded_size  # noqa: E402
from policies.slot_scoring import SlotScoring  # noqa: E402

logger = logging.getLogger("device_step_gpu")
K = BLOCK - 1


def fixed_scoring(rows: int, budget: int) -> SlotScoring:
    """vLLM's logistic shape (one table entry): survival falls with position."""
    base = np.tile(np.linspace(2.0, -1.0, K), (rows, 1))
    return SlotScoring(
        capacities=np.full(rows, K, dtype=np.int64),
        tasks=np.zeros(rows, dtype=np.int64),
        base=base,
        edges=np.zeros(0),
        alpha=np.ones((1, 1)),
        beta=np.zeros((1, 1)),
        scale=np.ones((1, 1)),
        max_log_odds=8.0,
        budget=budget,
    )


def kernel_ms(run: Callable[[], object], device: torch.device, steps: int) -> dict[str, Any]:
    """Per step: wall ms, the GPU's kernel ms (profiler) and the top kernels."""
    if device.type != "cuda":
        started = time.perf_counter()
        for _ in range(steps):
            run()
        return {"wall_ms": 1e3 * (time.perf_counter() - started) / steps}
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            run()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - started
    kernels: dict[str, float] = {}
    launches = 0
    try:
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels[event.name] = kernels.get(event.name, 0.0) + event.device_time_total / 1e3
                launches += 1
    except Exception as exc:  # the wall time still counts
        logger.warning("profiler events unreadable: %s", exc)
    busy = sum(kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    return {
        "wall_ms": 1e3 * wall / steps,
        "gpu_busy_ms": busy / steps,
        "gpu_idle_ms": 1e3 * wall / steps - busy / steps,
        "kernels_per_step": launches / steps,
        "top_kernels_ms": {name[:90]: round(ms / steps, 4) for name, ms in top},
    }


def mixed_widths(rows: int, k_match: int) -> list[int]:
    """Per-row k summing to ``rows * k_match`` with the widest at K (a two-phase step's
    verify width): K on a share of the rows, the rest as even as the total allows."""
    total = rows * k_match
    wide = max(1, min(rows, (total - rows) // K)) if rows > 1 else 1
    if rows == 1:
        return [k_match]
    rest = total - wide * K
    narrow = rows - wide
    if narrow == 0 or rest < 0:
        return [k_match] * rows
    base, extra = divmod(rest, narrow)
    ks = [K] * wide + [base + 1] * extra + [base] * (narrow - extra)
    return [min(K, k) for k in ks]


def torch_top1(runner: Any, fn: Callable[[], object]) -> object:
    """``fn`` with the runner's argmax and confidence in PyTorch's reductions (the runner's
    own setting is the other variant's: the kernels on CUDA, PyTorch's on a CPU)."""
    held, runner.fused_top1 = runner.fused_top1, False
    try:
        return fn()
    finally:
        runner.fused_top1 = held


TOP1_SHAPES = ((1, 1), (1, 15), (8, 15), (64, 8), (64, 15))  # (rows, positions)


def top1_check(
    device: torch.device,
    vocab: int,
    repeats: int,
    shapes: tuple[tuple[int, int], ...] = TOP1_SHAPES,
) -> dict[str, Any]:
    """The fused argmax and top-1 probability (engines/embedded/top1.py) against PyTorch's
    reductions on random bf16 logits of the engine's shapes: the argmax identical, the
    probability's largest error against a float64 softmax (both), and each one's device ms
    (CUDA events, the median of ``repeats``)."""
    from engines.embedded.top1 import reference, top1

    out: dict[str, Any] = {}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for rows, width in shapes:
        logits = 4 * torch.randn(rows, width, vocab, device=device).to(dtype)
        logits[0, 0, :7] = logits[0, 0].max()  # a tie: the first index must win
        exact = torch.softmax(logits.double(), dim=-1).amax(dim=-1)
        entry: dict[str, Any] = {}
        for with_prob in (False, True):
            fused = top1(logits, with_prob)
            torched = reference(logits, with_prob)
            key = "argmax_prob" if with_prob else "argmax"
            entry[f"{key}_identical"] = bool(torch.equal(fused[0], torched[0]))
            if with_prob:
                assert fused[1] is not None and torched[1] is not None
                entry["prob_max_abs_err"] = {
                    "fused": float((fused[1].double() - exact).abs().max()),
                    "torch": float((torched[1].double() - exact).abs().max()),
                }
            for label, fn in (
                ("fused", lambda x=logits, w=with_prob: top1(x, w)),
                ("torch", lambda x=logits, w=with_prob: reference(x, w)),
            ):
                entry[f"{key}_ms_{label}"] = round(timed_ms(fn, device, repeats), 4)
        out[f"{rows}x{width}"] = entry
    return out


def run_batch(
    bench: Bench,
    rows_n: int,
    k_match: int,
    steps: int,
    also: tuple[int, ...] = (),
    split_widths: bool = False,
    top1_ab: bool = False,
) -> dict[str, Any]:
    runner, device = bench.runner, bench.device
    rows = bench.requests(rows_n)
    uniforms = torch.rand(rows_n, 2 * BLOCK + 1)
    budget = rows_n * k_match
    plan = fixed_scoring(rows_n, budget)
    batch = padded_size(rows_n, runner.batch_sizes)
    fns: dict[str, Callable[[], object]] = {
        f"one_phase_k{k_match}": lambda: runner.step(rows, [k_match] * rows_n, uniforms),
        f"one_phase_k{K}": lambda: runner.step(rows, [K] * rows_n, uniforms),
        "two_phase_device": lambda: runner.step(rows, [K] * rows_n, uniforms, scoring=lambda: plan),
        "two_phase_host": lambda: runner.step(
            rows, [K] * rows_n, uniforms, allocate=lambda c: [k_match] * rows_n
        ),
    }
    for k in also:  # one-phase references at other k: the verify's cost between them
        fns.setdefault(f"one_phase_k{k}", lambda k=k: runner.step(rows, [k] * rows_n, uniforms))
    if split_widths:
        # Where a two-phase step's extra time goes at the matched tokens: the whole-block
        # draft (one-phase k_match drafting the whole block), the verify at the block's width
        # (one-phase, mixed per-row k of the same total, widest K), the allocation at the
        # narrow widths (two-phase, every row drafting k_match, so draft and verify stay
        # narrow).
        mixed = mixed_widths(rows_n, k_match)

        def whole_draft() -> object:
            runner.narrow_drafts = False
            try:
                return runner.step(rows, [k_match] * rows_n, uniforms)
            finally:
                runner.narrow_drafts = True

        fns[f"one_phase_k{k_match}_whole_draft"] = whole_draft
        fns["one_phase_mixed_widths"] = lambda: runner.step(rows, mixed, uniforms)
        fns[f"two_phase_device_cap{k_match}"] = lambda: runner.step(
            rows, [k_match] * rows_n, uniforms, scoring=lambda: plan
        )
    if top1_ab:  # the same steps with PyTorch's argmax and confidence reductions
        for name, fn in list(fns.items()):
            fns[f"{name}_torch_top1"] = lambda fn=fn: torch_top1(runner, fn)
    out: dict[str, Any] = {"rows": rows_n, "k_match": k_match, "budget": budget}
    with torch.inference_mode():
        verified = runner.step(rows, [K] * rows_n, uniforms, scoring=lambda: plan)
        out["device_verified_tokens"] = sum(k + 1 for k in verified.spec_tokens)
        out["device_host_ms"] = round(1e3 * runner.last_two_phase_s[1], 3)
        for fn in fns.values():  # warm every path once (graphs captured lazily)
            fn()
        order = list(fns)
        walls: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(3):  # alternating rounds, random order
            random.shuffle(order)
            for name in order:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                started = time.perf_counter()
                for _ in range(steps):
                    fns[name]()
                walls[name].append(1e3 * (time.perf_counter() - started) / steps)
        out["wall_ms_median"] = {n: round(float(np.median(w)), 3) for n, w in walls.items()}
        out["wall_ms_rounds"] = {n: [round(x, 3) for x in w] for n, w in walls.items()}
        out["profiled"] = {n: kernel_ms(fn, device, max(3, steps // 4)) for n, fn in fns.items()}
        conf = torch.rand(rows_n, K, device=device, dtype=torch.float64)
        width = padded_size(K + 1, runner.widths)
        tokens = runner.ragged_shapes.choose([rows_n + budget], batch, width)
        if tokens is not None:
            graphs = runner._allocation_graphs

            def allocation() -> object:
                return graphs.run(plan, [K] * rows_n, conf, batch, width, tokens)

            out["allocation_graph_only"] = kernel_ms(allocation, device, steps)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="tiny random shape (CPU smoke)")
    parser.add_argument("--attention", default="triton", choices=["sdpa", "triton"])
    parser.add_argument(
        "--rows", default="1:15,8:8,64:5", help="ROWS:K,... the batches and the k matched"
    )
    parser.add_argument(
        "--also-k",
        default="7",
        help="more one-phase k timed at every batch (comma-separated; '' for none): the "
        "verify's marginal cost per token on the same machine",
    )
    parser.add_argument("--steps", type=int, default=20, help="steps per timing round")
    parser.add_argument("--context-len", type=int, default=1024)
    parser.add_argument(
        "--compile-scope",
        choices=["none", *COMPILE_SCOPES],
        default="none",
        help="torch.compile the forwards before capture (layer: the engine's regional compile, "
        "as --compile-scope layer in bench/gpu_decisions.py); none: eager kernels in graphs",
    )
    parser.add_argument(
        "--split-widths",
        action="store_true",
        help="also time the parts of a two-phase step's extra cost at the matched tokens: "
        "the whole-block draft, the verify at the block's width, the allocation at narrow widths",
    )
    parser.add_argument(
        "--top1",
        action="store_true",
        help="also check and time the fused argmax / top-1 probability against PyTorch's "
        "reductions, alone and inside every timed step (engines/embedded/top1.py)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    pairs = [(int(r), int(k)) for r, k in (p.split(":") for p in args.rows.split(","))]
    batches = sorted({r for r, _ in pairs})
    check = check_args(
        [
            "--out", args.out, "--device", args.device, "--batches", ",".join(map(str, batches)),
            "--context-len", str(args.context_len),
            *(["--tiny"] if args.tiny else ["--attention", args.attention]),
            *([] if args.compile_scope == "none" else ["--compile", "--compile-scope",
                                                      args.compile_scope]),
        ]
    )  # fmt: skip
    if args.device == "cuda" and not torch.cuda.is_available():
        logger.error("--device cuda: CUDA is not available here (use --device cpu --tiny)")
        return 2
    random.seed(0)
    bench = Bench(check)
    result: dict[str, Any] = {"command": " ".join(sys.argv), "setup": bench.result["setup"]}
    if args.top1:
        vocab = int(bench.runner.target.shape.vocab_size)
        result["top1"] = (  # (--tiny: a few positions, for the CPU's Triton interpreter)
            top1_check(bench.device, vocab, 3, ((1, 1), (2, 3)))
            if args.tiny
            else top1_check(bench.device, vocab, 50)
        )
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print("top1", json.dumps(result["top1"]))
    result["batches"] = {}
    for rows_n, k in pairs:
        logger.info("rows %d, k %d", rows_n, k)
        also = tuple(int(x) for x in args.also_k.split(",") if x.strip())
        result["batches"][str(rows_n)] = run_batch(
            bench, rows_n, k, args.steps, also, args.split_widths, args.top1
        )
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for rows_n, entry in result["batches"].items():
        print(rows_n, entry["wall_ms_median"])
        for name, prof in entry["profiled"].items():
            print(" ", name, {k: round(v, 3) for k, v in prof.items() if isinstance(v, float)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
