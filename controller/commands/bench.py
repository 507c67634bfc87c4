"""``draftctl bench``: what speculation buys on an endpoint, per data set and load.

Drives any OpenAI-compatible endpoint (a draftctl daemon, a vLLM or SGLang server) with real
prompts, closed loop at each concurrency, streamed; against a draftctl daemon it can put each
``--policies`` file on through the admin API in turn (the original is restored after, on
errors and Ctrl-C too). The work is in loadgen/; this module reads the arguments and writes
the outputs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from loadgen import DEFAULT_DATASETS, PACKAGED_DATASETS

logger = logging.getLogger(__name__)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 1,8,32")
    return values


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("give a JSON object, e.g. '{\"top_k\": 1}'")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark an OpenAI-compatible endpoint with real prompts (tok/s, TTFT, TPOT)",
        description=(
            "Closed-loop streamed benchmark of an OpenAI-compatible endpoint (a draftctl "
            "daemon, or a vLLM/SGLang server directly) with real prompts, at each concurrency. "
            "Reports per data set x concurrency x policy: output tok/s, TTFT and TPOT p50/p99, "
            "the mean accept length the responses report, and the speedup over a no-speculation "
            "baseline when one is given. Writes bench.json and bench.png into --out."
        ),
        epilog=(
            "data sets: gsm8k, math500, mbpp (need --data-dir), humaneval, mt-bench, champ, "
            "sharegpt (installed data packages), jsonl:PATH (your prompts: one JSON object a "
            'line with "prompt" or "messages"). Example: draftctl bench --url '
            "http://127.0.0.1:8000 --datasets humaneval,mt-bench --concurrency 1,8 "
            "--policies static-k7.yaml goodput.yaml --baseline-policy no-spec.yaml --out runs/"
        ),
    )
    parser.add_argument("--url", required=True, help="endpoint base URL (without /v1)")
    parser.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    parser.add_argument(
        "--datasets",
        default=None,
        help=(
            f"comma-separated (default: {DEFAULT_DATASETS} with --data-dir; without it "
            f"{PACKAGED_DATASETS}, the ones the installed data packages hold)"
        ),
    )
    parser.add_argument(
        "--data-dir", type=Path, help="folder with gsm8k/, math500/ and mbpp/ JSONL files"
    )
    parser.add_argument(
        "--concurrency", type=_int_list, default=[1, 8, 32, 64], help="default: 1,8,32,64"
    )
    parser.add_argument("--requests", type=int, default=32, help="requests per cell (default: 32)")
    parser.add_argument("--max-tokens", type=int, default=256, help="per request (default: 256)")
    parser.add_argument(
        "--policies",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="draftctl daemon only: policy files put on in turn through the admin API",
    )
    baseline = parser.add_mutually_exclusive_group()
    baseline.add_argument(
        "--baseline-policy",
        type=Path,
        metavar="FILE",
        help="draftctl daemon only: a no-speculation policy run first; speedup is over it",
    )
    baseline.add_argument(
        "--baseline-url", help="a server without speculation, same model; speedup is over it"
    )
    parser.add_argument(
        "--admin-token",
        default=os.environ.get("DRAFTCTL_ADMIN_TOKEN"),
        help="admin API bearer token (default: $DRAFTCTL_ADMIN_TOKEN)",
    )
    parser.add_argument(
        "--extra-body",
        type=_json_object,
        default={},
        help="JSON merged into "
        "every request (e.g. '{\"return_spec_tokens_details\": true}' for SGLang)",
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    parser.add_argument("--out", type=Path, help="write bench.json and bench.png here")
    parser.add_argument("--json", action="store_true", help="print bench.json instead of a table")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from loadgen.admin import AdminError
    from loadgen.bench import BenchError, run_bench
    from loadgen.prompts import PromptError

    if args.requests < 1 or args.max_tokens < 1:
        logger.error("--requests and --max-tokens must be at least 1")
        return 2
    try:
        rows = asyncio.run(run_bench(args))
    except (PromptError, AdminError, BenchError) as exc:
        logger.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        logger.error("interrupted; the daemon's original policy was put back")
        return 130
    _emit(rows, args)
    return 0 if all(r["errors"] < r["requests"] for r in rows) else 1


def _emit(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from loadgen.summary import format_table

    document = {"runs": rows}
    text = json.dumps(document, indent=1)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(text + "\n")
        try:
            from loadgen.plot import write_plot

            logger.info("wrote %s", write_plot(rows, args.out / "bench.png"))
        except ImportError:
            logger.warning("no plot: matplotlib is not installed (pip install 'draftctl[plots]')")
    sys.stdout.write((text if args.json else format_table(rows)) + "\n")
