"""Text tables for a simulation report (the JSON is the report object itself)."""

from __future__ import annotations

from typing import Any


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_report(report: dict[str, Any]) -> str:
    """Per policy: overall goodput, then goodput / TPOT / TTFT / mean k for each phase."""
    policies: dict[str, Any] = report["policies"]
    phases = [p["name"] for p in report["phases"]]
    width = max(12, *(len(name) for name in policies))
    lines = [
        f"scenario {report['scenario']}: {report['duration_s']:.0f} s simulated; "
        f"acceptance: {report['acceptance_source']}; cost table: {report['cost_table']}",
        "",
        f"{'policy':<{width}} {'overall tok/s':>13}  "
        + "  ".join(f"{name[:22]:>22}" for name in phases),
        f"{'':<{width}} {'':>13}  " + "  ".join(f"{'tok/s TPOTms TTFTms k':>22}" for _ in phases),
    ]
    for name, result in policies.items():
        cells = []
        for phase in phases:
            p = result["phases"][phase]
            cells.append(
                f"{p['goodput_tok_s']:>7.0f} {_fmt(p['tpot_ms_mean'], '5.1f'):>5} "
                f"{_fmt(p['ttft_ms_mean'], '5.0f'):>5} {p['mean_spec_tokens']:>2.0f}"
            )
        lines.append(
            f"{name:<{width}} {result['goodput_tok_s']:>13.0f}  "
            + "  ".join(f"{c:>22}" for c in cells)
        )
    summary = report.get("summary") or {}
    if summary:
        lines.append("")
        ratios = [
            f"goodput vs best static ({summary['best_static']}): {summary['vs_best_static']:.3f}x",
            f"vs no-spec: {summary['vs_no_spec']:.3f}x",
        ]
        if "vs_oracle" in summary:
            ratios.append(f"vs oracle: {summary['vs_oracle']:.3f}x")
        lines.append("; ".join(ratios))
        for phase, row in summary["phases"].items():
            extra = f", vs oracle {row['vs_oracle']:.3f}x" if "vs_oracle" in row else ""
            lines.append(f"  {phase}: vs best static {row['vs_best_static']:.3f}x{extra}")
    return "\n".join(lines)
