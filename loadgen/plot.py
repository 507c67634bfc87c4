"""bench.png: output tok/s and TPOT p50 against concurrency, per data set, one line a policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(
        2, len(datasets), figsize=(3.6 * len(datasets) + 1, 6), squeeze=False, sharex=True
    )
    for column, dataset in enumerate(datasets):
        top, bottom = axes[0][column], axes[1][column]
        for policy in policies:
            mine = sorted(
                (r for r in rows if r["dataset"] == dataset and r["policy"] == policy),
                key=lambda r: r["concurrency"],
            )
            xs = [r["concurrency"] for r in mine]
            top.plot(xs, [r["output_tok_s"] for r in mine], "o-", label=policy)
            tpot = [r["tpot_ms"]["p50"] for r in mine]
            bottom.plot(xs, [float("nan") if v is None else v for v in tpot], "o-", label=policy)
        top.set_title(dataset)
        bottom.set_xlabel("concurrency")
        top.set_xscale("log", base=2)
    axes[0][0].set_ylabel("output tok/s")
    axes[1][0].set_ylabel("TPOT p50 (ms)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
