"""Plots of a simulation report (matplotlib, Agg backend; imported only when asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """goodput over time, per-phase goodput bars and the goodput policy's mean k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    name = report["scenario"]
    policies: dict[str, Any] = report["policies"]
    paths = []

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for policy, result in policies.items():
        series = result["series"]
        xs = [i * series["bin_s"] for i in range(len(series["goodput_tok_s"]))]
        style = "-" if policy in ("goodput", "oracle") else ":"
        top.plot(xs, series["goodput_tok_s"], style, label=policy, linewidth=1.2)
        if policy in ("goodput", "oracle"):
            ks = [k if k is not None else float("nan") for k in series["mean_spec_tokens"]]
            bottom.plot(xs, ks, label=policy)
    _mark_phases(report, (top, bottom))
    top.set_ylabel("goodput (tokens/s)")
    top.legend(fontsize=8, ncol=4)
    top.set_title(f"{name}: {report['acceptance_source']}")
    bottom.set_ylabel("mean k per decision")
    bottom.set_xlabel("simulated time (s)")
    bottom.legend(fontsize=8)
    paths.append(_save(fig, out_dir / f"{name}-timeline.png"))

    fig, ax = plt.subplots(figsize=(10, 4))
    phases = [p["name"] for p in report["phases"]]
    width = 0.8 / max(1, len(policies))
    for i, (policy, result) in enumerate(policies.items()):
        values = [result["phases"][p]["goodput_tok_s"] for p in phases]
        ax.bar([j + i * width for j in range(len(phases))], values, width, label=policy)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(phases))], phases)
    ax.set_ylabel("goodput (tokens/s)")
    ax.legend(fontsize=8, ncol=4)
    ax.set_title(f"{name}: goodput per phase")
    paths.append(_save(fig, out_dir / f"{name}-phases.png"))
    return paths


def _mark_phases(report: dict[str, Any], axes: tuple[Any, ...]) -> None:
    start = 0.0
    for phase in report["phases"]:
        for ax in axes:
            ax.axvline(start, color="grey", linewidth=0.5)
        axes[0].text(start, 0, f" {phase['name']}", fontsize=7, va="bottom")
        start += phase["duration_s"]


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
