"""Where an engine's plain (k = 0) decode step spends its time outside the graph it replays: a
``torch.profiler`` trace of whole ``Engine.step`` calls, summarised per step.

    python3 bench/plain_step_trace.py --out $OUT/plain_step_trace.json \\
        [--batch 1] [--steps 32] [--trace $OUT/trace.json.gz]            # H200, 8B shape
    python bench/plain_step_trace.py --tiny --device cpu --out /tmp/t.json   # CPU smoke

On the H200 (session 28) the graph of a batch-1 plain step took 4.54 ms and the whole engine
step 5.16 ms wall: 0.46-0.68 ms a step outside the graph, against ~54 us of Python measured on
a CPU with the forward taken out (``bench/plain_step_host.py``). This bench says what the rest
is. The runner is the engine's default on CUDA (compiled layer step, Triton attention,
``linear: auto``, deferred draft context, CUDA graphs; random bf16 weights); ``--batch``
requests decode greedily at k = 0 from a 512-token random prompt. It times ``--steps`` steps
without the profiler (``wall_ms``), then the same number under it, and reports per step:

- ``host_ops``: the operators and CUDA runtime calls with the most self CPU time (count and
  microseconds per step), e.g. ``cudaGraphLaunch``, ``cudaMemcpyAsync``, the sync;
- ``device_busy_ms``: the device's kernel and copy time (the sum of their durations: one
  stream), and ``device_idle_ms`` = the profiled step's wall minus that;
- the profiled step's wall beside the unprofiled one (the profiler's own cost).

The profiled steps run one plain step per ``Engine.step`` call (``plain_burst`` 1, as in
session 28). Then ``--bursts`` compares the engine's plain bursts (``Engine(plain_burst=n)``:
n plain steps queued back to back per host round trip) in ``--rounds`` rounds, the lengths in
a random order each round (``--order-seed``): ``bursts`` gives per length the wall time per
plain step of each round (a call's wall over the steps it ran) and their mean and spread,
and on CUDA the ratio to the batch's weight-read floor (``bench/decode_gpu.py``'s: the
target's and the draft context's weights and each row's K/V, over the measured copy
bandwidth). ``--k K`` makes every step a drafting one at k = K instead (the random weights'
drafts are almost never accepted: about a token a step) and the bursts drafting bursts
(``Engine(spec_burst=n)``); no floor then. ``--burst-graph N`` (plain steps): the runner also
captures its plain-burst graphs of N steps (``ModelRunner(plain_burst_graph=N)``: a whole
burst in one CUDA graph) and the bursts compared add ``Ng``, bursts of N replaying them, beside
N without them (the runner's ``burst_graphs`` off for every other length). ``--chain``
(plain steps): the bursts compared add ``Nc`` for each length N above 1, bursts of N chained
(``Engine(plain_chain=True)``: each queued before the last one is read), timed from a call's
return to the last call's (a chained call returns the burst the call before queued, so no sync
at either end: the settling burst before leaves the chain running).

``--trace`` also writes the Chrome trace (gzip) for a look at the timeline. ``--tiny --device
cpu``: a tiny random pair without compiling (graphs as static calls), CPU activity only: the
script's own test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LEN = 512


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--batch", type=int, default=1, help="requests decoding (default 1)")
    parser.add_argument("--steps", type=int, default=32, help="steps timed, then traced")
    parser.add_argument("--warmup", type=int, default=8, help="steps before any timing")
    parser.add_argument("--shape", default="qwen3-8b", help="target shape (default qwen3-8b)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random shape (CPU smoke)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--top", type=int, default=25, help="host operators listed (default 25)")
    parser.add_argument("--trace", type=Path, help="also write the Chrome trace here (gzip)")
    parser.add_argument(
        "--bursts",
        default="1,4,8",
        help="plain-burst lengths compared after the trace, comma-separated (default 1,4,8; "
        "empty: none)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --bursts (default 5)")
    parser.add_argument("--order-seed", type=int, default=0, help="seed of each round's order")
    parser.add_argument(
        "--k",
        type=int,
        default=0,
        help="k of every row (default 0: plain steps; above 0 the bursts are drafting ones, "
        "Engine.spec_burst, and the trace is of drafting steps)",
    )
    parser.add_argument(
        "--burst-graph",
        type=int,
        default=0,
        metavar="N",
        help="also compare bursts of N plain steps replaying one graph per burst (label Ng; "
        "default 0: none)",
    )
    parser.add_argument(
        "--chain",
        action="store_true",
        help="also compare each plain-burst length above 1 chained (label Nc; Engine.plain_chain)",
    )
    args = parser.parse_args(argv)
    if args.chain and args.k:
        parser.error("--chain: plain steps only (--k 0)")
    if args.burst_graph and (args.k or not 2 <= args.burst_graph <= 16):
        parser.error("--burst-graph: from 2 to 16 steps, with plain steps (--k 0)")
    if args.batch < 1 or args.steps < 1 or args.warmup < 1 or args.top < 1 or args.rounds < 1:
        parser.error("--batch, --steps, --warmup, --top and --rounds must be >= 1")
    try:
        args.bursts = [int(b) for b in args.bursts.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--bursts {args.bursts!r}: comma-separated integers")
    if any(not 1 <= b <= 16 for b in args.bursts):
        parser.error("--bursts: each length from 1 to 16")
    if not 0 <= args.k <= 15:
        parser.error("--k: from 0 to 15")
    return args


def build_engine(args: argparse.Namespace) -> Any:
    import torch

    from engines.embedded.engine import Engine
    from engines.embedded.loader import build_models
    from engines.embedded.runner import ModelRunner
    from engines.embedded.shapes import TARGET_SHAPES, TINY_SHAPE, dflash_draft_for

    shape = TINY_SHAPE if args.tiny else TARGET_SHAPES[args.shape]
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    max_seq_len = PROMPT_LEN + new_tokens(args) + 64
    torch.manual_seed(0)
    spec = dflash_draft_for(shape)
    target, draft = build_models(shape, spec, device, dtype, max_seq_len + 64)
    runner = ModelRunner(
        target,
        draft,
        device,
        dtype,
        args.batch,
        max_seq_len,
        use_cuda_graphs=True,
        compile_forwards=cuda,
        compile_scope="layer",
        attention="auto",
        defer_context=True if args.burst_graph else None,
        plain_burst_graph=args.burst_graph,
    )
    return Engine(runner, args.batch, max_seq_len, plain_burst=1, spec_burst=1), shape


def new_tokens(args: argparse.Namespace) -> int:
    """Tokens each request may make: warm-up, the timed and the traced steps, every burst
    round (a settling burst, then the steps rounded up to whole bursts; ``--burst-graph``'s
    ``Ng`` label is a round's burst too, and ``Nc``'s with the burst its chain leaves queued),
    room to spare."""
    lengths = [*args.bursts, *([args.burst_graph] if args.burst_graph else [])]
    chained = [b for b in args.bursts if b > 1 and getattr(args, "chain", False)]
    rounds = args.rounds * (
        sum(args.steps + 2 * b for b in lengths) + sum(args.steps + 3 * b for b in chained)
    )
    # Drafting steps: the random weights' drafts are almost never accepted (about a token a
    # step), and a drafting burst needs room for k + 1 tokens a step to the end.
    room = (args.k + 1) * 2 * max(args.bursts, default=1) if args.k else 16
    return args.warmup + 2 * args.steps + rounds + room


def add_requests(engine: Any, shape: Any, args: argparse.Namespace) -> None:
    import torch

    from engines.embedded.events import SamplingParams
    from engines.embedded.request import Request

    for row in range(args.batch):
        prompt = torch.randint(0, shape.vocab_size, (PROMPT_LEN,)).tolist()
        params = SamplingParams(max_new_tokens=new_tokens(args))
        engine.add(Request(f"plain{row}", prompt, params, lambda view, k=args.k: k, {}))


def timed_steps(engine: Any, steps: int, synchronize: Any) -> list[float]:
    walls = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        synchronize()
        walls.append(time.perf_counter() - started)
    return walls


def timed_burst(engine: Any, steps: int, synchronize: Any) -> float:
    """Seconds per plain step over at least ``steps`` steps of ``engine`` (its
    ``plain_burst`` as set), whole calls timed end to end (chained: from one call's return, no
    sync at either end, the chain running on)."""
    rows = len(engine.scheduler.running)
    reports = 0  # one per row per plain step
    chained = getattr(engine, "plain_chain", False)
    if not chained:
        synchronize()
    started = time.perf_counter()
    while reports < steps * rows:
        events = engine.step()
        reports += sum(1 for _, e in events if getattr(e, "report", None) is not None)
        if not events or len(engine.scheduler.running) != rows:
            raise RuntimeError("a request ran out of tokens mid-run (new_tokens' room)")
    if not chained:
        synchronize()
    return (time.perf_counter() - started) / (reports / rows)


def compare_bursts(
    engine: Any, args: argparse.Namespace, synchronize: Any, floor_ms: float | None
) -> dict[str, Any]:
    """Per burst length (and ``Ng``: N replaying the plain-burst graphs, ``--burst-graph``),
    the wall time per plain step in each round (random order per round)."""
    import random

    order_rng = random.Random(args.order_seed)
    labels = [str(b) for b in args.bursts] + ([f"{args.burst_graph}g"] if args.burst_graph else [])
    labels += [f"{b}c" for b in args.bursts if b > 1 and args.chain]
    runs: dict[str, list[float]] = {label: [] for label in labels}
    orders = []
    for _ in range(args.rounds):
        order = list(labels)
        order_rng.shuffle(order)
        orders.append(order)
        for label in order:
            burst = int(label.rstrip("gc"))
            engine.runner.burst_graphs = label.endswith("g")
            engine.plain_chain = label.endswith("c")
            engine.plain_burst = engine.spec_burst = burst
            timed_burst(engine, burst, synchronize)  # settle into this length
            runs[label].append(1e3 * timed_burst(engine, args.steps, synchronize))
    engine.plain_burst = engine.spec_burst = 1
    engine.plain_chain = False
    out: dict[str, Any] = {"orders": orders}
    for burst, values in runs.items():
        mean = statistics.fmean(values)
        cell: dict[str, Any] = {
            "ms_per_step": [round(v, 4) for v in values],
            "mean": round(mean, 4),
            "sd": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
            "min": round(min(values), 4),
            "max": round(max(values), 4),
        }
        if floor_ms:
            cell["ratio_to_floor"] = round(mean / floor_ms, 4)
        out[str(burst)] = cell
    return out


def floor_of(engine: Any, batch: int) -> dict[str, float]:
    """The batch's weight-read floor, as bench/decode_gpu.py reckons it (CUDA only)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from decode_gpu import PROMPT_LEN as FLOOR_PROMPT_LEN
    from decode_gpu import batch_floor_ms, kv_bytes_per_row, weight_bytes
    from engine_gpu import hbm_bandwidth_bytes_per_s

    assert FLOOR_PROMPT_LEN == PROMPT_LEN, "the floor's context is this bench's prompt"
    runner = engine.runner
    sizes = weight_bytes(runner)
    bandwidth = hbm_bandwidth_bytes_per_s()
    kv = kv_bytes_per_row(runner.target.shape, PROMPT_LEN)
    floor = batch_floor_ms(sizes["target"] + sizes["draft_context"], kv, batch, bandwidth)
    return {"floor_ms": round(floor, 4), "bandwidth_tb_s": round(bandwidth / 1e12, 3)}


def summarise(profile: Any, steps: int, top: int) -> dict[str, Any]:
    """Per step: the host operators with the most self CPU time, and the device's busy time."""
    rows = []
    busy_us = 0.0
    for item in profile.key_averages():
        device_us = float(getattr(item, "self_device_time_total", 0.0) or 0.0)
        busy_us += device_us
        rows.append(
            {
                "name": item.key,
                "calls_per_step": round(item.count / steps, 2),
                "self_cpu_us_per_step": round(item.self_cpu_time_total / steps, 1),
                "device_us_per_step": round(device_us / steps, 1),
            }
        )
    rows.sort(key=lambda r: -r["self_cpu_us_per_step"])
    runtime = [r for r in rows if r["name"].startswith("cuda")]
    return {
        "host_ops": rows[:top],
        "cuda_runtime": runtime[:top],
        "host_self_cpu_ms": round(sum(r["self_cpu_us_per_step"] for r in rows) / 1e3, 3),
        "device_busy_ms": round(busy_us / steps / 1e3, 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch
    from torch.profiler import ProfilerActivity, profile

    if args.device == "cuda" and not torch.cuda.is_available():
        print("plain_step_trace: no CUDA device (use --device cpu --tiny)", file=sys.stderr)
        return 2
    if args.device == "cpu" and not args.tiny:
        print(
            "plain_step_trace: --device cpu runs the tiny shape only (add --tiny)", file=sys.stderr
        )
        return 2
    cuda = args.device == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    started = time.perf_counter()
    engine, shape = build_engine(args)
    start_s = time.perf_counter() - started
    add_requests(engine, shape, args)
    timed_steps(engine, args.warmup, synchronize)  # prefills, first steps, lazy set-up
    walls = timed_steps(engine, args.steps, synchronize)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        traced = timed_steps(engine, args.steps, synchronize)
    summary = summarise(prof, args.steps, args.top)
    traced_ms = 1e3 * statistics.fmean(traced)
    floor = floor_of(engine, args.batch) if cuda and args.k == 0 else {}
    bursts = compare_bursts(engine, args, synchronize, floor.get("floor_ms")) if args.bursts else {}
    runner = engine.runner
    report = {
        "command": "python " + " ".join(["bench/plain_step_trace.py", *(argv or sys.argv[1:])]),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "shape": "tiny" if args.tiny else args.shape,
        "batch": args.batch,
        "k": args.k,
        "steps": args.steps,
        "runner": runner.kernel_settings(),
        "start_s": round(start_s, 1),
        "wall_ms": {
            "mean": round(1e3 * statistics.fmean(walls), 3),
            "median": round(1e3 * statistics.median(walls), 3),
            "min": round(1e3 * min(walls), 3),
            "max": round(1e3 * max(walls), 3),
        },
        "profiled_wall_ms": round(traced_ms, 3),
        **summary,
        "device_idle_ms": round(traced_ms - summary["device_busy_ms"], 3) if cuda else None,
        **floor,
        "bursts": bursts,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    if args.trace is not None:
        with tempfile.TemporaryDirectory() as scratch:
            raw = Path(scratch) / "trace.json"
            prof.export_chrome_trace(str(raw))
            with raw.open("rb") as source, gzip.open(args.trace, "wb") as target:
                shutil.copyfileobj(source, target)
    print(json.dumps({k: v for k, v in report.items() if k not in ("host_ops", "cuda_runtime")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
