"""How torch.compile's start-up grows with the target's depth: whole forward vs regional.

For a tiny target shape at several depths (random weights, this machine's device), time the
first call of the verify forward compiled two ways, each from a fresh dynamo and inductor
state (no on-disk cache): ``forward``, ``torch.compile`` of the whole forward (what
``torch_compile: true`` did), and ``layer``, the target's decoder-layer step compiled once for
all layers (``compile_scope: layer``, regional compilation). The compile time depends on the
graph's operations, not on the tensors' sizes, so the growth with depth carries over to the
real shapes (36 layers for Qwen3-8B, 64 for 32B), whose absolute times the GPU run of
``bench/decode_gpu.py --compile-scope layer`` reports. Also checks both give eager's logits.

    .venv/bin/python bench/compile_start.py [--depths 2,8,16,36] \\
        > bench/results/compile_start_cpu.json

``--warm-cache``: instead, each case twice in fresh processes sharing one new on-disk cache
folder (``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` as the embedded backend's
``compile_cache_dir`` sets them, inductor's caches on): a first start, then a restart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one(depth: int, scope: str) -> dict[str, float]:
    """One measurement in this process (called in a fresh child process per case)."""
    import torch

    from engines.embedded.loader import build_models
    from engines.embedded.runner import ModelRunner
    from engines.embedded.shapes import TINY_SHAPE, dflash_draft_for

    shape = replace(TINY_SHAPE, num_layers=depth)
    spec = dflash_draft_for(shape, 16, 1)
    torch.manual_seed(0)
    target, draft = build_models(shape, spec, torch.device("cpu"), torch.float32, 256)
    runner = ModelRunner(target, draft, torch.device("cpu"), torch.float32, 2, 128, False)
    ids = torch.randint(0, shape.vocab_size, (2, 8))
    positions = torch.arange(8)[None].repeat(2, 1) + 5
    with torch.inference_mode():
        eager = runner._verify_forward(ids, positions)
        started = time.perf_counter()
        if scope == "forward":
            compiled = torch.compile(runner._verify_forward, fullgraph=True, dynamic=False)
            logits = compiled(ids, positions)
        else:
            target.compile_layers()
            logits = runner._verify_forward(ids, positions)
        seconds = time.perf_counter() - started
    return {"first_call_s": round(seconds, 2), "max_abs_diff": float((logits - eager).abs().max())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="2,8,16,36", help="target layer counts")
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="each case twice sharing a new on-disk compile cache: a first start, a restart",
    )
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # DEPTH:SCOPE, internal
    args = parser.parse_args()
    if args.case:
        depth, scope = args.case.split(":")
        print(json.dumps(one(int(depth), scope)))
        return 0
    off = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    cases: dict[str, dict[str, object]] = {}
    depths = [int(d) for d in args.depths.split(",")]
    for depth in depths:
        for scope in ("forward", "layer"):
            if not args.warm_cache:
                result: object = _child(depth, scope, dict(os.environ, **off))
            else:
                with tempfile.TemporaryDirectory() as folder:
                    env = {k: v for k, v in os.environ.items() if k not in off}
                    env["TORCHINDUCTOR_CACHE_DIR"] = folder
                    env["TRITON_CACHE_DIR"] = str(Path(folder) / "triton")
                    result = {"first_start": _child(depth, scope, env)}
                    result["restart"] = _child(depth, scope, env)
            cases.setdefault(str(depth), {})[scope] = result
            print(f"depth {depth:3d} {scope:7s}: {result}", file=sys.stderr)
    print(
        json.dumps(
            {
                "command": "python bench/compile_start.py " + " ".join(sys.argv[1:]),
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
                "python": platform.python_version(),
                "device": "cpu",
                "cache": (
                    "per case a first start and a restart in fresh processes sharing a new "
                    "on-disk cache folder, inductor's caches on"
                    if args.warm_cache
                    else "fresh process per case, inductor FX graph and autograd caches off"
                ),
                "depths": cases,
            },
            indent=1,
        )
    )
    return 0


def _child(depth: int, scope: str, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--case", f"{depth}:{scope}"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    raise SystemExit(main())
