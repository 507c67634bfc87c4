"""Plots of a fleet simulation report (matplotlib, Agg backend; imported only when asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.plot import _mark_phases, _save


def write_fleet_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """Per-phase goodput bars of every fleet, and goodput over time of the main ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    name = report["scenario"]
    fleets: dict[str, Any] = report["fleets"]
    phases = [p["name"] for p in report["phases"]]

    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.85 / max(1, len(fleets))
    for i, (fleet, result) in enumerate(fleets.items()):
        values = [result["phases"][p]["goodput_tok_s"] for p in phases]
        hatch = "//" if "oracle" in fleet else None
        ax.bar([j + i * width for j in range(len(phases))], values, width, label=fleet, hatch=hatch)
    ax.set_xticks([j + 0.425 - width / 2 for j in range(len(phases))], phases)
    ax.set_ylabel("fleet goodput (tokens/s)")
    ax.legend(fontsize=7, ncol=4)
    ax.set_title(f"{name}: goodput per phase ({report['instances']} instances; hatched = bound)")
    paths = [_save(fig, out_dir / f"{name}-phases.png")]

    fig, ax = plt.subplots(figsize=(11, 4.5))
    for fleet, result in fleets.items():
        if fleet.startswith("uniform-static") or "oracle" in fleet:
            continue
        series = result["series"]
        xs = [i * series["bin_s"] for i in range(len(series["goodput_tok_s"]))]
        ax.plot(xs, series["goodput_tok_s"], label=fleet, linewidth=1.1)
    _mark_phases(report, (ax,))
    ax.set_ylabel("fleet goodput (tokens/s)")
    ax.set_xlabel("simulated time (s)")
    ax.legend(fontsize=8, ncol=3)
    ax.set_title(f"{name}: goodput over time")
    paths.append(_save(fig, out_dir / f"{name}-timeline.png"))
    return paths
