"""The few-token linear kernel (engines/embedded/gemv.py) against F.linear (cuBLAS), per weight
matrix of a decode step: time, the weight-read bandwidth it reaches, the block sizes it runs
(``config``), and the largest difference from F.linear; for the matrices whose layer fuses a
part into the kernel (``PARTS``: the RMSNorm before q/k/v and gate/up, the residual add after
the attention output, the SiLU gate and the add around the down projection), the fused call
(``fused_us``) against the kernel with the part in PyTorch ops (``unfused_us``).

    python3 bench/gemv_gpu.py --out $OUT/gemv_gpu.json [--shapes qwen3-8b,qwen3-32b]
        [--rows 1,2,8,16]                                    # H200
    python bench/gemv_gpu.py --smoke --out /tmp/g.json       # CPU: TRITON_INTERPRET=1, tiny

Matrices per target shape: the fused q/k/v projection, the attention output, the fused
gate/up, the down projection, the LM head, and the DFlash draft's context projection (fc). On
CUDA each (matrix, rows) is timed as CUDA-graph replays of ``--calls`` back-to-back calls
(the engine replays graphs; a Python launch would dominate a 10 us kernel), best of
``--rounds`` rounds, one kernel after the other; random bf16 weights and inputs.
``--every-config`` also times each of ``gemv.CANDIDATES`` on its own (``configs_us``). The
bandwidth is the weight bytes over the time; the copy bandwidth beside it is
``engine_gpu.hbm_bandwidth_bytes_per_s`` (bytes read + written per second, as decode_gpu.py's
floor). ``--smoke``: a tiny shape on the CPU under Triton's interpreter, one untimed call each
(the script's own test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def matrices(shape: Any, draft_inputs: int) -> dict[str, tuple[int, int]]:
    """(N, K) of each weight matrix a decode step multiplies, by name."""
    hd = shape.head_dim
    return {
        "qkv": ((shape.num_heads + 2 * shape.num_kv_heads) * hd, shape.hidden_size),
        "o_proj": (shape.hidden_size, shape.num_heads * hd),
        "gate_up": (2 * shape.intermediate_size, shape.hidden_size),
        "down": (shape.hidden_size, shape.intermediate_size),
        "lm_head": (shape.vocab_size, shape.hidden_size),
        "draft_fc": (shape.hidden_size, draft_inputs * shape.hidden_size),
    }


def graph_call_s(fn: Any, calls: int, rounds: int) -> float:
    """Seconds per call: CUDA-graph replays of ``calls`` calls of ``fn``, best of ``rounds``."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # the autotuner's timing and any compile, outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        started = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


# The parts a decoder layer fuses into each matrix's kernel (ModelRunner(linear="fused")).
PARTS = {"qkv": "norm", "o_proj": "residual", "gate_up": "norm", "down": "act"}


def part_args(part: str, rows: int, n: int, k: int, gen: Any, device: Any, dtype: Any) -> Any:
    """The input and ``gemv.linear`` keyword arguments of one fused part: an RMSNorm before
    the product (norm), the residual add after it (residual), or the SiLU gate before and the
    residual after (act: x is [gate | up], 2k wide)."""
    import torch

    x = torch.randn(rows, 2 * k if part == "act" else k, generator=gen, device=device).to(dtype)
    kwargs: dict[str, Any] = {}
    if part == "norm":
        kwargs.update(norm_weight=torch.ones(k, device=device, dtype=dtype), eps=1e-6)
    else:
        kwargs.update(residual=torch.randn(rows, n, generator=gen, device=device).to(dtype))
        kwargs.update(act=part == "act")
    return x, kwargs


def measure(
    n: int,
    k: int,
    rows: int,
    smoke: bool,
    calls: int,
    rounds: int,
    every_config: bool = False,
    part: str | None = None,
) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from engines.embedded.gemv import default_config, linear, small_linear

    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(rows * 7919 + n)
    weight = (torch.randn(n, k, generator=gen, device=device) / k**0.5).to(dtype)
    x = torch.randn(rows, k, generator=gen, device=device).to(dtype)
    ours = small_linear(x, weight, None)
    reference = F.linear(x, weight)
    cell: dict[str, Any] = {
        "n": n,
        "k": k,
        "rows": rows,
        "weight_bytes": weight.numel() * weight.element_size(),
        "max_abs_diff": float((ours.float() - reference.float()).abs().max()),
        "reference_abs_max": float(reference.float().abs().max()),
    }
    functions = {
        "gemv": lambda: small_linear(x, weight, None),
        "f_linear": lambda: F.linear(x, weight),
    }
    if part is not None:  # the layer's parts inside the kernel, and around it in PyTorch ops
        px, kwargs = part_args(part, rows, n, k, gen, device, dtype)
        fused = linear(px, weight, None, True, True, **kwargs)
        cell["part"] = part
        cell["fused_max_abs_diff"] = float(
            (fused.float() - linear(px, weight, None, **kwargs).float()).abs().max()
        )
        functions["fused"] = lambda: linear(px, weight, None, True, True, **kwargs)
        functions["unfused"] = lambda: linear(px, weight, None, True, False, **kwargs)
    if smoke:
        return cell
    timed = {name: graph_call_s(fn, calls, rounds) for name, fn in functions.items()}
    if every_config:  # each configuration on its own (what ONE_ROW_CONFIG, TILE_CONFIG are)
        from engines.embedded.gemv import CANDIDATES, launch

        cell["configs_us"] = {
            "x".join(map(str, config)): 1e6
            * graph_call_s(lambda config=config: launch(x, weight, None, config), calls, rounds)
            for config in CANDIDATES
            if rows == 1 or config[0] >= 16
        }
    if part is not None:
        cell.update(fused_us=1e6 * timed["fused"], unfused_us=1e6 * timed["unfused"])
    cell.update(
        gemv_us=1e6 * timed["gemv"],
        f_linear_us=1e6 * timed["f_linear"],
        gemv_over_f_linear=timed["gemv"] / timed["f_linear"],
        gemv_bytes_per_s=cell["weight_bytes"] / timed["gemv"],
        f_linear_bytes_per_s=cell["weight_bytes"] / timed["f_linear"],
        config="x".join(map(str, default_config(rows, k))),
    )
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--shapes", default="qwen3-8b,qwen3-32b", help="comma-separated names")
    parser.add_argument("--rows", default="1,2,8,16", help="tokens per call (at most 16)")
    parser.add_argument("--calls", type=int, default=20, help="calls per CUDA graph")
    parser.add_argument("--rounds", type=int, default=5, help="timed replays (best)")
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny shape on the CPU (interpreter), untimed"
    )
    parser.add_argument(
        "--every-config",
        action="store_true",
        help="also time every block configuration on its own (configs_us; gemv.CANDIDATES)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    import torch

    from engines.embedded.gemv import MAX_ROWS
    from engines.embedded.shapes import TARGET_SHAPES, TINY_SHAPE, dflash_draft_for

    rows = [int(r) for r in args.rows.split(",")]
    if bad := [r for r in rows if not 1 <= r <= MAX_ROWS]:
        parser.error(f"--rows {bad}: use 1..{MAX_ROWS}")
    names = ["tiny"] if args.smoke else args.shapes.split(",")
    if unknown := [n for n in names if n != "tiny" and n not in TARGET_SHAPES]:
        parser.error(f"--shapes: unknown {unknown}; use {', '.join(sorted(TARGET_SHAPES))}")
    if not args.smoke and not torch.cuda.is_available():
        parser.error("needs a CUDA device (or --smoke)")
    report: dict[str, Any] = {
        "command": "python " + " ".join(["bench/gemv_gpu.py", *(argv or sys.argv[1:])]),
        "torch": torch.__version__,
        "device": "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name(),
        "shapes": {},
    }
    if not args.smoke:
        from engine_gpu import hbm_bandwidth_bytes_per_s

        report["hbm_copy_bytes_per_s"] = hbm_bandwidth_bytes_per_s()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        shape = TINY_SHAPE if name == "tiny" else TARGET_SHAPES[name]
        draft_inputs = len(dflash_draft_for(shape).target_layer_ids)
        cells: dict[str, Any] = {}
        for matrix, (n, k) in matrices(shape, draft_inputs).items():
            for r in rows:
                cell = measure(
                    n,
                    k,
                    r,
                    args.smoke,
                    args.calls,
                    args.rounds,
                    args.every_config,
                    PARTS.get(matrix),
                )
                cells[f"{matrix}/rows{r}"] = cell
                print(name, matrix, r, json.dumps(cell), flush=True)
        report["shapes"][name] = cells
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
