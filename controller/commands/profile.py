"""``draftctl profile-cost``: measure the verify cost table T(batch, tokens per request).

Runs on a CUDA machine with random bf16 weights of a named shape (or a target directory's
shape) and writes the cost-table JSON the adaptive policy reads.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "profile-cost",
        help="measure verify cost T(batch, tokens per request) on CUDA, write a cost table",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--shape", help="named shape: qwen3-0.6b, qwen3-1.7b, qwen3-8b, ...")
    source.add_argument("--target", type=Path, help="take the shape from this HF target dir")
    parser.add_argument("--out", type=Path, required=True, help="cost table JSON to write")
    parser.add_argument("--context-len", type=int, default=1024)
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128")
    parser.add_argument("--tokens-per-request", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=20, help="graph replays per point")
    parser.set_defaults(func=run)


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} {text!r}: expected positive integers")
    return values


def run(args: argparse.Namespace) -> int:
    from engines.embedded.checkpoint import CheckpointError, target_shape
    from engines.embedded.profiler import cost_table_document, measure_cost_table
    from engines.embedded.shapes import shape_by_name

    try:
        batch_sizes = _ints(args.batch_sizes, "--batch-sizes")
        tokens = _ints(args.tokens_per_request, "--tokens-per-request")
        shape = shape_by_name(args.shape) if args.shape else target_shape(args.target)
        table = measure_cost_table(shape, args.context_len, batch_sizes, tokens, args.repeats)
    except (CheckpointError, ValueError) as exc:
        logger.error("profile-cost: %s", exc)
        return 2
    import torch

    name = args.shape or args.target.name
    command = "draftctl " + shlex.join(sys.argv[1:])
    document = cost_table_document(
        name, torch.cuda.get_device_name(), args.context_len, batch_sizes, tokens, table, command
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    logger.info("wrote %s", args.out)
    return 0
