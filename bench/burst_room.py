"""How long the engine's drafting bursts can be in a closed loop of rows: a host-only model
of ``Engine._burst_plan`` (docs/engine.md, "Drafting bursts").

    python bench/burst_room.py --out bench/results/burst_room_model.json

Rows decode at one k each (1 row at 15, 8 at 15, 64 at 7 by default), each step accepting a
geometric run (each drafted position survives with ``--survival``, the bonus token always
emitted); a row ending is replaced at once by one of a fresh length (``--output-tokens``,
uniform; the first rows start part-way). Every step asks the engine's own burst rule for
the burst's length and each row's k in it, with its ``burst_cut_share`` set to each ``--shares``
value (0: no cuts, the rule before session 31). Reported per case and share: the mean burst
length (steps per host round trip), the share of steps that ran in full-length bursts, and
the drafted tokens the cuts took (a share of what the planned k would have drafted). A model:
no device, no acceptance profile, one seed.

``--ends unseen``: each row ends at its drawn length as at an end-of-sequence token the engine
cannot see (it sees no end: the rule plans every burst in full, no cuts), so a burst runs its
remaining steps for a row that ended (scratch, until the burst ends and a fresh row takes its
slot). Reported also: ``scratch_row_steps``, those row-steps' share of all row-steps (0 with
ends the engine sees), and ``net_at_overhead``: what bursts give against single steps when a
host round trip costs each given share of a single step's time (``--overheads``; a burst of n
steps costs n - share(n - 1) single steps, its scratch row-steps emit nothing).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engines.embedded.engine import Engine  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument(
        "--cases", default="1:15,8:15,64:7", help="ROWS:K,... (default 1:15,8:15,64:7)"
    )
    parser.add_argument("--shares", default="0,0.125,0.25", help="Engine.burst_cut_share values")
    parser.add_argument("--burst", type=int, default=4, help="spec_burst (default 4)")
    parser.add_argument("--steps", type=int, default=4000, help="steps modelled per case")
    parser.add_argument("--survival", type=float, default=0.8, help="per-position survival")
    parser.add_argument("--output-tokens", default="256,512", help="MIN,MAX (default 256,512)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ends",
        choices=("length", "unseen"),
        default="length",
        help="rows end where the engine sees (its room rule) or where it cannot (unseen)",
    )
    parser.add_argument(
        "--overheads",
        default="0.05,0.09,0.15",
        help="round-trip shares of a single step's time for net_at_overhead (H200 batch-1 "
        "k = 15, session 31: 0.69 of 7.66 ms, 0.09)",
    )
    return parser.parse_args(argv)


class _Runner:
    def spec_steps(self) -> None:  # (the rule only asks whether the runner has it)
        raise NotImplementedError


def _engine(burst: int, share: float) -> Engine:
    engine = Engine.__new__(Engine)  # the rule reads these five attributes only
    engine.spec_burst, engine.plain_burst, engine.runner, engine.planner = burst, 1, _Runner(), None
    engine.burst_cut_share = share
    return engine


def model(
    rows: int, k: int, args: argparse.Namespace, share: float, span: tuple[int, int]
) -> dict[str, Any]:
    rng = random.Random(f"{args.seed}:{rows}:{k}")  # the same rows and draws for every share
    engine = _engine(args.burst, share)
    remaining = [max(1, rng.randint(*span) - rng.randint(0, span[0])) for _ in range(rows)]
    unseen = args.ends == "unseen"
    lengths: list[int] = []
    planned = cut = steps_run = scratch = 0
    while steps_run < args.steps:
        # unseen ends: the engine sees no end (room for any burst at the full k)
        views = [SimpleNamespace(num_remaining=1 << 20 if unseen else n) for n in remaining]
        ks = [k if unseen else min(k, n - 1) for n in remaining]  # the engine's own clamp
        steps, burst_k = engine._burst_plan(views, ks)  # type: ignore[arg-type]
        lengths.append(steps)
        planned += steps * sum(ks)
        cut += steps * (sum(ks) - sum(burst_k))
        for _ in range(steps):
            for i in range(rows):
                if remaining[i] <= 0:  # ended earlier in this burst: a scratch row-step
                    scratch += 1
                    continue
                run = 1
                while run < burst_k[i] + 1 and rng.random() < args.survival:
                    run += 1
                remaining[i] -= run
        remaining = [n if n > 0 else rng.randint(*span) for n in remaining]
        steps_run += steps
    mean_burst = statistics.fmean(lengths)
    waste = scratch / (steps_run * rows)
    overheads = [float(x) for x in args.overheads.split(",")]
    return {
        "mean_burst": mean_burst,
        "full_bursts": sum(n for n in lengths if n == args.burst) / steps_run,
        "drafted_cut": cut / planned if planned else 0.0,
        "scratch_row_steps": waste,
        # a single step costs 1 (share o of it the round trip); a step of a mean burst
        # 1 - o + o / mean_burst, and a share ``waste`` of its row-steps emits nothing
        "net_at_overhead": {str(o): (1.0 - waste) / (1.0 - o + o / mean_burst) for o in overheads},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    span = tuple(int(x) for x in args.output_tokens.split(","))
    cases = [tuple(int(x) for x in c.split(":")) for c in args.cases.split(",")]
    shares = [float(x) for x in args.shares.split(",")]
    results: dict[str, Any] = {
        f"{rows}x{k}": {
            str(share): model(rows, k, args, share, span)  # type: ignore[arg-type]
            for share in shares
        }
        for rows, k in cases
    }
    report = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "burst": args.burst,
        "survival": args.survival,
        "output_tokens": list(span),
        "ends": args.ends,
        "default_share": Engine.burst_cut_share,
        "cases": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for case, by_share in results.items():
        print(
            case,
            "  ".join(
                f"share {s}: {v['mean_burst']:.2f} steps, cut {v['drafted_cut']:.3f}, "
                f"scratch {v['scratch_row_steps']:.3f}"
                for s, v in by_share.items()
            ),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
