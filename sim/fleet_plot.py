"""Plots of a fleet simulation report (matplotlib, Agg backend; imported only when asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.plot import _mark_phases, _save


def write_fleet_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """Per-phase goodput of every fleet against uniform-schedule, and goodput over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    name = report["scenario"]
    fleets: dict[str, Any] = report["fleets"]
    phases = [p["name"] for p in report["phases"]]

    base = "uniform-schedule" if "uniform-schedule" in fleets else next(iter(fleets))
    groups = [*phases, "overall"]

    def ratio(result: dict[str, Any], group: str) -> float:
        mine = result if group == "overall" else result["phases"][group]
        ref = fleets[base] if group == "overall" else fleets[base]["phases"][group]
        return float(mine["goodput_tok_s"]) / max(1e-9, float(ref["goodput_tok_s"]))

    fig, ax = plt.subplots(figsize=(13, 4.8))
    cmap = plt.get_cmap("tab20")
    colors = [cmap(i) for i in range(20)]
    width = 0.85 / max(1, len(fleets))
    for i, (fleet, result) in enumerate(fleets.items()):
        values = [ratio(result, g) for g in groups]
        hatch = "//" if "oracle" in fleet else None
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, values, width, label=fleet, hatch=hatch, color=colors[i % len(colors)])
    ax.axhline(1.0, color="black", linewidth=0.7)
    ax.set_xticks([j + 0.425 - width / 2 for j in range(len(groups))], groups)
    ax.set_ylim(0.3, 1.15)
    ax.set_ylabel(f"goodput / {base}")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title(
        f"{name}: fleet goodput per phase against {base} "
        f"({report['instances']} instances; hatched = clairvoyant bound)"
    )
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
