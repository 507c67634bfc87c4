"""A run's samples -> one ``bench.json`` row, the speedups, and the printed table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from loadgen.runner import Run


def percentile_ms(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) in milliseconds; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return round(1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def run_row(dataset: str, concurrency: int, policy: str, run: Run) -> dict[str, Any]:
    """The figures of one (data set, concurrency, policy) cell (format: docs/bench.md)."""
    ok = [s for s in run.samples if s.ok]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpots = [s.tpot_s for s in ok if s.tpot_s is not None]
    accepts = [s.accept_length for s in ok if s.accept_length is not None]
    tokens = sum(s.output_tokens for s in ok)
    return {
        "dataset": dataset,
        "concurrency": concurrency,
        "policy": policy,
        "requests": len(run.samples),
        "errors": len(run.samples) - len(ok),
        "output_tokens": tokens,
        "duration_s": round(run.duration_s, 3),
        "output_tok_s": tokens / run.duration_s if run.duration_s > 0 else 0.0,
        "ttft_ms": {"p50": percentile_ms(ttfts, 0.5), "p99": percentile_ms(ttfts, 0.99)},
        "tpot_ms": {"p50": percentile_ms(tpots, 0.5), "p99": percentile_ms(tpots, 0.99)},
        "mean_accept_length": statistics.fmean(accepts) if accepts else None,
        "speedup": None,
        "first_error": next((s.error for s in run.samples if not s.ok), None),
    }


def add_speedups(rows: list[dict[str, Any]], baseline: str | None) -> None:
    """``speedup``: output tok/s over the ``baseline`` policy's at the same cell (in place)."""
    if baseline is None:
        return
    base = {(r["dataset"], r["concurrency"]): r for r in rows if r["policy"] == baseline}
    for row in rows:
        other = base.get((row["dataset"], row["concurrency"]))
        if other is not None and other["output_tok_s"] > 0:
            row["speedup"] = row["output_tok_s"] / other["output_tok_s"]


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'dataset':12s} {'conc':>4s} {'policy':16s} {'reqs':>5s} {'tok/s':>8s} "
        f"{'TTFT p50':>9s} {'TTFT p99':>9s} {'TPOT p50':>9s} {'TPOT p99':>9s} "
        f"{'accept':>6s} {'speedup':>7s}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['dataset'][:12]:12s} {r['concurrency']:4d} {r['policy'][:16]:16s} "
            f"{r['requests']:5d} {r['output_tok_s']:8.1f} "
            f"{_ms(r['ttft_ms']['p50'])} {_ms(r['ttft_ms']['p99'])} "
            f"{_ms(r['tpot_ms']['p50'])} {_ms(r['tpot_ms']['p99'])} "
            f"{_num(r['mean_accept_length'], 6, 2)} {_num(r['speedup'], 7, 2, 'x')}"
        )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{'-':>9s}" if value is None else f"{value:9.1f}"


def _num(value: float | None, width: int, digits: int, suffix: str = "") -> str:
    text = "-" if value is None else f"{value:.{digits}f}{suffix}"
    return f"{text:>{width}s}"
