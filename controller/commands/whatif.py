"""``draftctl simulate --replay TRACE --policy FILE``: a policy edit on the traffic served.

The replay itself is sim/replay.py; this module only reads the files and prints the report.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "what-if on recorded traffic",
        "replay a trace the daemon recorded (config.yaml recording:) under --policy",
    )
    group.add_argument(
        "--replay", type=Path, metavar="TRACE", help="recorded trace file (rotated files too)"
    )
    group.add_argument("--policy", type=Path, metavar="FILE", help="the policy to try on it")
    group.add_argument(
        "--recorded-policy",
        type=Path,
        metavar="FILE",
        help="the policy that served the trace: replayed too, and the what-if is compared "
        "with its replay (the simulator's bias cancels) instead of the recorded figures",
    )
    group.add_argument(
        "--last", type=float, metavar="SECONDS", help="only the trace's last SECONDS"
    )
    group.add_argument(
        "--no-calibrate",
        action="store_true",
        help="price steps with the engine's start-up profile as it is, not scaled to the "
        "step times the trace measured",
    )


def run_replay(args: argparse.Namespace) -> int:
    from policies.model import parse_policy
    from policies.validation import InvalidDocument
    from sim.replay import TraceError, compare, load_trace

    if args.policy is None:
        logger.error("--replay needs --policy FILE: the policy to try on the recorded traffic")
        return 2
    try:
        trace = load_trace(args.replay, args.last)
        what_if = (str(args.policy), parse_policy(args.policy.read_text()))
        recorded = None
        if args.recorded_policy is not None:
            text = args.recorded_policy.read_text()
            recorded = (str(args.recorded_policy), parse_policy(text))
        folder = args.policy.resolve().parent
        report = compare(trace, what_if, recorded, folder, calibrate=not args.no_calibrate)
    except InvalidDocument as exc:
        for problem in exc.problems:
            logger.error("policy: %s", problem)
        return 2
    except (OSError, TraceError, ValueError) as exc:
        logger.error("cannot replay %s: %s", args.replay, exc)
        return 2
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    sys.stdout.write((text if args.json else format_comparison(report)) + "\n")
    return 0


def format_comparison(report: dict[str, Any]) -> str:
    """The report as a table: recorded, (recorded policy replayed), what-if, and the delta."""
    columns = [("recorded", report["recorded"])]
    if "recorded_policy_replayed" in report:
        columns.append(("replayed", report["recorded_policy_replayed"]))
    columns.append(("what-if", report["what_if"]))
    rows = [
        ("requests", lambda f: f"{f['requests']}"),
        ("output tok/s", lambda f: f"{f['output_tok_s']:.1f}"),
        ("TTFT p50 ms", lambda f: _ms(f["ttft_ms"]["p50"])),
        ("TPOT p50 ms", lambda f: _ms(f["tpot_ms"]["p50"])),
        ("TPOT p99 ms", lambda f: _ms(f["tpot_ms"]["p99"])),
        ("mean k", lambda f: f"{f['mean_spec_tokens']:.2f}"),
    ]
    lines = [f"{'':14s}" + "".join(f"{name:>12s}" for name, _ in columns)]
    for label, cell in rows:
        lines.append(f"{label:14s}" + "".join(f"{cell(f):>12s}" for _, f in columns))
    delta = report["delta"]
    against = "its replay" if "recorded_policy_replayed" in report else "the recorded figures"
    lines.append(
        f"what-if against {against}: {_pct(delta['output_tok_s'])} tok/s, "
        f"TPOT p50 {_pct(delta['tpot_p50'])}, TTFT p50 {_pct(delta['ttft_p50'])}"
    )
    if "reproduction_error" in report:
        lines.append(f"replay of the recorded policy: {_pct(report['reproduction_error'])} tok/s")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f}%"
