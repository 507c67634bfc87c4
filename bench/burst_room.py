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
    lengths: list[int] = []
    planned = cut = steps_run = 0
    while steps_run < args.steps:
        views = [SimpleNamespace(num_remaining=n) for n in remaining]
        ks = [min(k, n - 1) for n in remaining]  # the engine's own clamp
        steps, burst_k = engine._burst_plan(views, ks)  # type: ignore[arg-type]
        lengths.append(steps)
        planned += steps * sum(ks)
        cut += steps * (sum(ks) - sum(burst_k))
        for _ in range(steps):
            for i in range(rows):
                run = 1
                while run < burst_k[i] + 1 and rng.random() < args.survival:
                    run += 1
                remaining[i] -= run
        remaining = [n if n > 0 else rng.randint(*span) for n in remaining]
        steps_run += steps
    return {
        "mean_burst": statistics.fmean(lengths),
        "full_bursts": sum(n for n in lengths if n == args.burst) / steps_run,
        "drafted_cut": cut / planned if planned else 0.0,
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
        "default_share": Engine.burst_cut_share,
        "cases": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for case, by_share in results.items():
        print(
            case,
            "  ".join(
                f"share {s}: {v['mean_burst']:.2f} steps, cut {v['drafted_cut']:.3f}"
                for s, v in by_share.items()
            ),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
