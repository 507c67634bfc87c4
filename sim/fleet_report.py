"""Text tables for a fleet simulation report (the JSON is the report object itself)."""

from __future__ import annotations

from typing import Any

from sim.report import _fmt


def format_fleet_report(report: dict[str, Any]) -> str:
    """Per fleet: overall goodput and TTFT p99, then goodput / TTFT p99 / mean k per phase."""
    fleets: dict[str, Any] = report["fleets"]
    phases = [p["name"] for p in report["phases"]]
    width = max(len(n) for n in fleets)
    lines = [
        f"scenario {report['scenario']}: {report['instances']} instances, "
        f"{report['duration_s']:.0f} s simulated; acceptance: {report['acceptance_source']}; "
        f"cost table: {report['cost_table']}",
        "",
        f"{'fleet':<{width}} {'tok/s':>7} {'TTFTp99':>7} {'latency':>7}  "
        + "  ".join(f"{name[:20]:>20}" for name in phases),
        f"{'':<{width}} {'':>7} {'s':>7} {'mean s':>7}  "
        + "  ".join(f"{'tok/s TTFTp99 k':>20}" for _ in phases),
    ]
    for name, fleet in fleets.items():
        cells = []
        for phase in phases:
            p = fleet["phases"][phase]
            cells.append(
                f"{p['goodput_tok_s']:>7.0f} {_fmt(p['ttft_p99_s'], '7.2f'):>7} "
                f"{p['mean_spec_tokens']:>4.1f}"
            )
        latency = fleet.get("latency_ms_mean")
        lines.append(
            f"{name:<{width}} {fleet['goodput_tok_s']:>7.0f} "
            f"{_fmt(fleet['ttft_p99_s'], '7.2f'):>7} "
            f"{_fmt(None if latency is None else latency / 1e3, '7.2f'):>7}  "
            + "  ".join(f"{c:>20}" for c in cells)
        )
    lines.extend(_summary_lines(report.get("summary") or {}))
    return "\n".join(lines)


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    if not summary:
        return []
    measure = summary.get("objective", "goodput")
    lines = [
        "",
        f"best uniform static: {summary['best_uniform_static']}; best uniform (bounds "
        f"excluded): {summary['best_uniform']}; ratios of "
        + ("1 / mean request latency (open-loop traffic)" if measure == "latency" else "goodput"),
    ]
    for name, checks in summary.items():
        if not isinstance(checks, dict):
            continue
        parts = [
            f"{checks['vs_best_uniform_static']:.3f}x best uniform static",
            f"{checks.get('vs_uniform_schedule', float('nan')):.3f}x uniform-schedule",
            f"min phase {checks['min_phase_vs_no_spec']:.3f}x no-spec",
            f"TTFT p99 {_fmt(checks['ttft_p99_vs_best_uniform'], '.2f')}x best uniform's",
        ]
        lines.append(f"  {name}: " + "; ".join(parts))
    return lines
