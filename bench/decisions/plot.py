"""Plots of a GPU-decisions run (issue #13): tok/s per phase per policy (mean, and the spread
over repeats as error bars), and the k each policy ran over the trace (per step where the run
recorded its timeline, else the mean k of each phase).

    .venv/bin/python -m bench.decisions.plot RAW.json [RAW.json ...] --out docs/gpu_decisions.png

``RAW.json``: what ``bench/gpu_decisions.py --out`` writes (one arm each; one row of panels per
file). Needs matplotlib (the ``plots`` extra).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.decisions.report import read_report


def _k_series(run: dict[str, Any]) -> tuple[list[float], list[float], list[tuple[float, str]]]:
    """x (step, or phase index), k, and where each phase starts, for one run."""
    xs: list[float] = []
    ks: list[float] = []
    starts: list[tuple[float, str]] = []
    for index, (name, phase) in enumerate(run["phases"].items()):
        timeline = phase.get("timeline")
        start = float(len(xs)) if timeline else float(index)
        starts.append((start, name))
        if timeline:
            for rows, k, *_ in timeline:
                if rows:
                    xs.append(float(len(xs)))
                    ks.append(float(k))
        else:
            xs += [index, index + 1]
            ks += [phase["mean_spec_tokens"]] * 2
    return xs, ks, starts


def write_plot(reports: Sequence[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(reports), 2, figsize=(13, 3.8 * len(reports)), squeeze=False)
    for row, report in enumerate(reports):
        left, right = axes[row]
        policies = report["summary"]["policies"]
        names = sorted(policies, key=lambda n: -policies[n]["tok_s_mean"])
        phases = [p["name"] for p in report["phases"]]
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            cells = [policies[name]["phases"][p] for p in phases]
            left.bar(
                [j + i * width for j in range(len(phases))],
                [c["tok_s_mean"] for c in cells],
                width,
                yerr=[c.get("tok_s_spread", 0.0) for c in cells],
                label=f"{name} ({policies[name]['repeats']}x)",
            )
        left.set_xticks([j + 0.4 - width / 2 for j in range(len(phases))], phases)
        left.set_ylabel("tok/s")
        left.set_title(f"{report['arm']}: tok/s per phase (error bar: half-range)")
        left.legend(fontsize=7, ncol=2)
        seen: set[str] = set()
        for run in report["runs"]:
            if run["policy"] in seen or run["policy"] == "no-spec":
                continue
            seen.add(run["policy"])
            xs, ks, starts = _k_series(run)
            right.step(xs, ks, where="post", label=run["policy"], linewidth=0.9)
        for start, name in starts if report["runs"] else []:
            right.axvline(start, color="grey", linewidth=0.5)
            right.text(start, 15.6, name, fontsize=7)
        timed = any("timeline" in p for r in report["runs"][:1] for p in r["phases"].values())
        right.set_xlabel("decode step" if timed else "phase")
        right.set_ylabel("k (widest in the step)" if timed else "mean k")
        right.set_ylim(-0.5, 16.5)
        right.set_title(f"{report['arm']}: k over the trace (first run of each policy)")
        right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "raw", type=Path, nargs="+", help="bench/gpu_decisions.py --out files (.json or .json.gz)"
    )
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = parser.parse_args(argv)
    reports = [read_report(p) for p in args.raw]
    print(write_plot(reports, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
