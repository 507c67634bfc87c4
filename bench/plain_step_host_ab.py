"""The host time of a plain step from two code trees, alternating: ``bench/plain_step_host.py``
of tree A, then B (order shuffled per repeat), ``--repeats`` times; per tree the median of each
run's fast-path median, and every run kept (CPU).

    .venv/bin/python bench/plain_step_host_ab.py --tree old=/tmp/old --tree new=. --batch 64 \\
        --repeats 5 --out bench/results/plain_step_host_ab.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH (twice)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="plain_step_host.py --rounds")
    parser.add_argument("--tokens", type=int, default=300, help="plain_step_host.py --tokens")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree)
    if len(trees) != 2 or args.repeats < 1:
        parser.error("two --tree NAME=PATH and --repeats >= 1")
    rng = random.Random(args.seed)
    runs: dict[str, list[float]] = {name: [] for name in trees}
    order: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            names = list(trees)
            rng.shuffle(names)
            for name in names:
                out = Path(scratch) / f"{name}{repeat}.json"
                subprocess.run(
                    [
                        sys.executable,
                        "bench/plain_step_host.py",
                        "--out",
                        str(out),
                        "--batch",
                        str(args.batch),
                        "--rounds",
                        str(args.rounds),
                        "--tokens",
                        str(args.tokens),
                    ],
                    cwd=Path(trees[name]).resolve(),
                    check=True,
                    capture_output=True,
                )
                runs[name].append(json.loads(out.read_text())["summary"]["fast"]["median_us"])
                order.append(name)
                print(name, runs[name][-1], flush=True)
    report = {
        "command": " ".join(["bench/plain_step_host_ab.py", *(argv or sys.argv[1:])]),
        "machine": "cpu",
        "batch": args.batch,
        "order": order,
        "fast_median_us": {
            name: {
                "median": round(statistics.median(v), 1),
                "mean": round(statistics.fmean(v), 1),
                "min": min(v),
                "max": max(v),
                "runs": v,
            }
            for name, v in runs.items()
        },
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
