"""Where the time of one engine step goes, kernel by kernel (issue #16 diagnostics).

For the shape's target and its DFlash draft (random weights), at each batch size: the draft
forward over the whole block, the padded verify at each width, (batch > 1) a ragged verify
of rows of mixed widths as the ragged graphs run it (compare it with the padded verify of
width 8, about the same tokens: issue #16's "ragged within 5% of padded at equal tokens"),
and (batch 1) the plain decode step. Each case is timed as a CUDA-graph replay (what the
engine runs) and profiled eagerly with ``torch.profiler``; kernels are grouped into GEMM,
attention, normalisation, index (gathers, scatters, cache writes), elementwise and other,
and the largest are listed. The one-layer attention cases also time the split-KV Triton
attention (``attention: triton``) at the widest width and at width 1, beside SDPA.
Two levers are timed beside the engine's own forward: attention reading only the keys the
rows use (``num_keys`` rounded to 64) instead of the whole cache, and each SDPA backend on
the step's masked attention call.

    python bench/step_breakdown_gpu.py --shape qwen3-8b --batches 1,64 --out OUT.json

On a CPU (``--device cpu --shape tiny``) it runs as a smoke test; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.embedded.kv_cache import KVCache
from engines.embedded.layers import (
    KeyPositions,
    attention_mask,
    cached_attention,
    check_grouped_attention,
)
from engines.embedded.loader import build_models
from engines.embedded.packing import Packing
from engines.embedded.ragged import ragged_index
from engines.embedded.shapes import TINY_SHAPE, dflash_draft_for, shape_by_name

CATEGORIES = (
    # split_kernel / merge_kernel: the split-KV Triton attention (decode_attention.py)
    (
        "attention",
        re.compile(r"fmha|flash|attention|attn|cudnn.*sdpa|split_kernel|merge_kernel", re.I),
    ),
    ("gemm", re.compile(r"gemm|cutlass|nvjet|sm90_|sm80_|cublas|matmul|gemv|splitk", re.I)),
    ("norm", re.compile(r"norm", re.I)),
    ("index", re.compile(r"index|scatter|gather|put_|take", re.I)),
    ("softmax", re.compile(r"softmax|logsumexp|reduce|max", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|copy|cat|fill", re.I)),
)


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return "other"


def timed_ms(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median ms of ``fn`` (a graph replay on CUDA)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def graphed(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    if device.type != "cuda":
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def kernel_breakdown(fn: Callable[[], Any], device: torch.device, top: int) -> dict[str, Any]:
    """Kernel time per category and the largest kernels of one eager call (after a warm one)."""
    fn()
    if device.type != "cuda":
        return {}
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    by_kernel: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_kernel[event.name].append(event.time_range.elapsed_us() / 1e3)
    by_category: dict[str, float] = defaultdict(float)
    for name, values in by_kernel.items():
        by_category[category(name)] += sum(values)
    largest = sorted(by_kernel.items(), key=lambda item: -sum(item[1]))[:top]
    return {
        "kernel_ms_total": round(sum(by_category.values()), 3),
        "kernels": sum(len(v) for v in by_kernel.values()),
        "by_category_ms": {k: round(v, 3) for k, v in sorted(by_category.items())},
        "largest": [
            {
                "name": name[:120],
                "calls": len(v),
                "ms": round(sum(v), 3),
                "category": category(name),
            }
            for name, v in largest
        ],
    }


def first_use(shape: Any, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The masked attention of eager prefills at shapes not seen before (rows x longest prompt
    of a batched prefill), per backend choice: ms of each shape's first call and of its
    second. cuDNN's SDPA builds a kernel per new shape; the engine's eager forwards leave it
    out (``ModelRunner._eager_forward``)."""
    heads, kv_heads, dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
    choices: dict[str, list[Any] | None] = {"default": None, "no_cudnn": _NO_CUDNN}
    out: dict[str, Any] = {}
    for index, (label, backends) in enumerate(choices.items()):
        firsts, seconds = [], []
        for rows, length in ((3 + 5 * i + index, 41 + 9 * i + 2 * index) for i in range(6)):
            q = torch.randn(rows, length, heads, dim, device=device, dtype=dtype)
            k = torch.randn(rows, kv_heads, length, dim, device=device, dtype=dtype)
            visible = torch.ones(length, length, device=device).tril().bool()
            mask = attention_mask(visible.expand(rows, -1, -1), heads, kv_heads)

            def call(
                q: torch.Tensor = q,
                k: torch.Tensor = k,
                m: torch.Tensor = mask,
                backends: list[Any] | None = backends,
            ) -> None:
                if backends is None:
                    cached_attention(q, k, k, m)
                else:
                    with torch.nn.attention.sdpa_kernel(backends):
                        cached_attention(q, k, k, m)

            firsts.append(timed_ms(call, device, 1))
            seconds.append(timed_ms(call, device, 1))
        out[label] = {
            "first_call_ms": [round(x, 3) for x in firsts],
            "second_call_ms": [round(x, 3) for x in seconds],
        }
    return out


_NO_CUDNN = [
    torch.nn.attention.SDPBackend.FLASH_ATTENTION,
    torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
    torch.nn.attention.SDPBackend.MATH,
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-8b", help="target shape, or 'tiny'")
    parser.add_argument("--batches", default="1,64", help="batch sizes")
    parser.add_argument("--widths", default="1,8,16", help="verify widths")
    parser.add_argument("--cache-len", type=int, default=768, help="cache positions per slot")
    parser.add_argument("--context", type=int, default=320, help="position of every row")
    parser.add_argument("--repeats", type=int, default=30, help="timed replays per case")
    parser.add_argument("--top", type=int, default=12, help="largest kernels listed per case")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--attention",
        default="sdpa",
        choices=["sdpa", "triton"],
        help="the target's attention in the whole-step cases (triton: the split-KV kernel, "
        "ragged steps reading packed queries in place; CUDA, or TRITON_INTERPRET=1)",
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON to write")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY_SHAPE if args.shape == "tiny" else shape_by_name(args.shape)
    spec = dflash_draft_for(shape)
    block = spec.block_size
    batches = [int(b) for b in args.batches.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    torch.manual_seed(0)
    target, draft = build_models(shape, spec, device, dtype, args.cache_len + 2 * block)
    if args.attention == "triton":
        check_grouped_attention(shape.num_heads, shape.num_kv_heads, shape.head_dim, device, dtype)
    target.attention = args.attention
    slots = max(batches)

    def cache_for(num_layers: int) -> KVCache:
        return KVCache(
            num_layers, slots, shape.num_kv_heads, args.cache_len, shape.head_dim, dtype, device
        )

    caches = {"target": cache_for(shape.num_layers), "draft": cache_for(spec.shape.num_layers)}
    for cache in caches.values():
        cache.k.normal_()
        cache.v.normal_()
    used_keys = -(-(args.context + block) // 64) * 64
    report: dict[str, Any] = {
        "command": "python bench/step_breakdown_gpu.py " + " ".join(sys.argv[1:]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": args.shape,
        "cache_len": args.cache_len,
        "context": args.context,
        "used_keys": used_keys,
        "attention": args.attention,
        "cases": {},
    }
    started = time.perf_counter()

    def verify(ids: torch.Tensor, pos: torch.Tensor, num_keys: int | None) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            hidden, features = target(ids, pos, caches["target"], num_keys=num_keys)
            draft.insert_context(features, pos, caches["draft"])
            return target.logits(hidden)

        return run

    def propose(ids: torch.Tensor, pos: torch.Tensor, num_keys: int | None) -> Callable[[], Any]:
        return lambda: draft.propose(ids, pos, caches["draft"], target, num_keys=num_keys)

    # Ragged verify as the runner's ragged graphs run it: the rows' tokens packed for the
    # GEMMs, norms, RoPE and cache writes; queries unpacked to [B, W] for attention; logits
    # scattered back. Rows of mixed widths (lengths 1..W, mean ~8 tokens: k ~7), against the
    # padded verify of width 8 at the same batch, whose token count is about the same.
    query_rows = max(batches) * widths[-1] + 1
    ragged_queries = torch.zeros(
        query_rows * shape.num_heads * shape.head_dim, device=device, dtype=dtype
    )
    ragged_logits = torch.zeros(query_rows, shape.vocab_size, device=device, dtype=dtype)

    def ragged_lengths(batch: int, width: int) -> list[int]:
        rng = random.Random(batch)
        return [rng.randint(1, width) for _ in range(batch)]

    def ragged(ids: torch.Tensor, pos: torch.Tensor, num_keys: int | None) -> Callable[[], Any]:
        batch, width = ids.shape
        lengths = ragged_lengths(batch, width)
        index = ragged_index(lengths, batch, width, sum(lengths)).to(device)

        def run() -> torch.Tensor:
            packing = Packing.from_indices((batch, width), index[0], index[1])
            packing.query_buffer = ragged_queries
            hidden, features = target(
                ids, pos, caches["target"], num_keys=num_keys, packing=packing
            )
            draft.insert_context(features, pos, caches["draft"], packing=packing)
            return packing.unpack(target.logits(hidden), out=ragged_logits)

        return run

    with torch.inference_mode():
        for batch in batches:
            cases: list[tuple[str, Callable[..., Callable[[], Any]], int]] = [
                (f"verify {batch}x{w}", verify, w) for w in widths
            ]
            cases.append((f"draft {batch}x{block}", propose, block))
            if batch > 1:
                tokens = sum(ragged_lengths(batch, widths[-1]))
                cases.append((f"ragged {batch}x{widths[-1]} ({tokens} tokens)", ragged, widths[-1]))
            for name, make, width in cases:
                ids = torch.randint(0, shape.vocab_size, (batch, width), device=device)
                pos = (args.context + torch.arange(width, device=device)).repeat(batch, 1)
                whole = make(ids, pos, None)
                used = make(ids, pos, used_keys)
                entry: dict[str, Any] = {
                    "graph_ms": round(timed_ms(graphed(whole, device), device, args.repeats), 4),
                    "graph_ms_used_keys": round(
                        timed_ms(graphed(used, device), device, args.repeats), 4
                    ),
                    "profile": kernel_breakdown(whole, device, args.top),
                }
                report["cases"][name] = entry
                print(
                    f"{name}: {entry['graph_ms']} ms (used keys {entry['graph_ms_used_keys']})",
                    f"{entry['profile'].get('by_category_ms')}",
                    flush=True,
                )
            # The masked attention call alone, per SDPA backend, at this batch's widest verify.
            width = widths[-1]
            heads, kv_heads, dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
            q = torch.randn(batch, width, heads, dim, device=device, dtype=dtype)
            k_all, v_all = caches["target"].rows(0, 0, batch)
            pos = (args.context + torch.arange(width, device=device)).repeat(batch, 1)
            backends: dict[str, Any] = {}
            for keys in (args.cache_len, used_keys):
                visible = torch.arange(keys, device=device)[None, None, :] <= pos[:, :, None]
                mask = attention_mask(visible, heads, kv_heads)
                for backend in ("default", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION"):

                    def call(
                        mask: torch.Tensor = mask,
                        keys: int = keys,
                        q: torch.Tensor = q,
                        k_all: torch.Tensor = k_all,
                        v_all: torch.Tensor = v_all,
                    ) -> torch.Tensor:
                        return cached_attention(q, k_all[:, :, :keys], v_all[:, :, :keys], mask)

                    label = f"{backend} keys={keys}"
                    try:
                        if backend == "default":
                            ms = timed_ms(graphed(call, device), device, args.repeats)
                        else:
                            kind = getattr(torch.nn.attention.SDPBackend, backend)
                            with torch.nn.attention.sdpa_kernel(kind):
                                ms = timed_ms(graphed(call, device), device, args.repeats)
                        backends[label] = round(ms, 4)
                    except Exception as exc:  # a backend that refuses these inputs
                        backends[label] = f"unsupported: {str(exc).splitlines()[0][:120]}"
            # The split-KV Triton attention (attention: triton), at the widest width and at
            # width 1 (a plain decode step), beside SDPA's default at width 1.
            for w in (width, 1):
                seen = torch.arange(args.cache_len, device=device)[None, None, :]
                dense = attention_mask(seen <= pos[:, :w, None], heads, kv_heads)
                for kernel in ("triton", "default") if w == 1 else ("triton",):

                    def attend(
                        kernel: str = kernel,
                        w: int = w,
                        q: torch.Tensor = q,
                        k_all: torch.Tensor = k_all,
                        v_all: torch.Tensor = v_all,
                        pos: torch.Tensor = pos,
                        dense: torch.Tensor = dense,
                    ) -> torch.Tensor:
                        k, v = k_all[:, :, : args.cache_len], v_all[:, :, : args.cache_len]
                        if kernel == "triton":
                            return cached_attention(q[:, :w], k, v, KeyPositions(pos[:, :w]))
                        return cached_attention(q[:, :w], k, v, dense)

                    label = f"{kernel} W={w} keys={args.cache_len}"
                    try:
                        backends[label] = round(
                            timed_ms(graphed(attend, device), device, args.repeats), 4
                        )
                    except Exception as exc:  # keep the other figures
                        backends[label] = f"failed: {str(exc).splitlines()[0][:160]}"
            report["cases"][f"attention {batch}x{width} (one layer)"] = backends
            print(f"attention {batch}x{width}: {backends}", flush=True)
        report["first_use"] = first_use(shape, device, dtype)
        print(f"first use of new attention shapes: {report['first_use']}", flush=True)
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out} in {report['elapsed_s']} s")


if __name__ == "__main__":
    main()
