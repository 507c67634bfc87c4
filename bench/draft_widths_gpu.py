"""What the narrow draft graphs save: replay time of the draft graph that computes the first 7
positions' logits (width 8) against the whole block's (width 16), per batch size, on a CUDA
device (random bf16 weights of a target shape, its z-lab style 5-layer DFlash draft, CUDA
graphs, eager kernels; each figure the mean of 100 back-to-back replays after one warm-up,
best of ``--rounds`` rounds in alternating order).

    python3 bench/draft_widths_gpu.py --shape qwen3-8b --batches 1,8,64 > draft_widths.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engines.embedded.events import ATTENTIONS, Attention  # noqa: E402
from engines.embedded.loader import build_models  # noqa: E402
from engines.embedded.runner import GRAPH_BATCH_SIZES, ModelRunner  # noqa: E402
from engines.embedded.shapes import TARGET_SHAPES, dflash_draft_for  # noqa: E402

MAX_SEQ_LEN = 1024


def replay_ms(graph: Any, repeats: int = 100) -> float:
    graph.graph.replay()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        graph.graph.replay()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - started) / repeats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(TARGET_SHAPES))
    parser.add_argument("--batches", default="1,8,64", help="captured batch sizes to time")
    parser.add_argument("--attention", default="triton", choices=ATTENTIONS)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per batch")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (CUDA-graph replays are what is timed)")
    batches = [int(b) for b in args.batches.split(",")]
    if any(b not in GRAPH_BATCH_SIZES for b in batches):
        parser.error(f"batch sizes must be captured ones {GRAPH_BATCH_SIZES}")
    device, dtype = torch.device("cuda"), torch.bfloat16
    shape = TARGET_SHAPES[args.shape]
    spec = dflash_draft_for(shape, 16)
    torch.manual_seed(0)
    target, draft = build_models(shape, spec, device, dtype, MAX_SEQ_LEN + 64)
    attention: Attention = args.attention
    started = time.perf_counter()
    runner = ModelRunner(
        target, draft, device, dtype, max(batches), MAX_SEQ_LEN, True, attention=attention
    )
    capture_s = time.perf_counter() - started
    result: dict[str, Any] = {
        "command": " ".join(["python3", "bench/draft_widths_gpu.py", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "shape": args.shape,
        "attention": args.attention,
        "draft_widths": runner.draft_widths,
        "capture_s": round(capture_s, 1),
        "batch": {},
    }
    for batch in batches:
        times: dict[int, list[float]] = {w: [] for w in runner.draft_widths}
        for round_ in range(args.rounds):
            order = runner.draft_widths if round_ % 2 == 0 else runner.draft_widths[::-1]
            for width in order:
                times[width].append(replay_ms(runner._graphs["draft", batch, width]))
        best = {w: min(ts) for w, ts in times.items()}
        result["batch"][str(batch)] = {
            "draft_ms": {str(w): round(t, 4) for w, t in best.items()},
            "rounds_ms": {str(w): [round(t, 4) for t in ts] for w, ts in times.items()},
            "narrow_over_whole": round(best[min(best)] / best[max(best)], 4),
        }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
