"""Markdown tables for docs/goodput.md from the JSON reports in this folder.

.venv/bin/python results/sim/tables.py > /tmp/tables.md
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MIXED = [
    "mixed-shift",
    "mixed-shift-reference",
    "mixed-shift-b16",
    "mixed-shift-32b",
    "mixed-shift-ragged",
    "mixed-shift-host-overhead",
    "mixed-shift-parametric",
    "mixed-shift-parametric-heterogeneous",
]
CELLS = [f"steady-{t}-c{c}" for t in ("math", "code", "chat") for c in (1, 8, 64)]


def load(name: str) -> dict[str, Any]:
    return json.loads((HERE / f"{name}.json").read_text())


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def policy_table(report: dict[str, Any]) -> str:
    phases = [p["name"] for p in report["phases"]]
    head = " | ".join(f"{p} tok/s · TPOT ms · TTFT ms · mean k" for p in phases)
    lines = [f"| policy | overall tok/s | {head} |", "|---|---:|" + "---:|" * len(phases)]
    for name, result in report["policies"].items():
        cells = []
        for phase in phases:
            f = result["phases"][phase]
            cells.append(
                f"{f['goodput_tok_s']:.0f} · {_fmt(f['tpot_ms_mean'], '.1f')} · "
                f"{_fmt(f['ttft_ms_mean'], '.0f')} · {f['mean_spec_tokens']:.1f}"
            )
        bold = "**" if name == "goodput" else ""
        lines.append(
            f"| {bold}{name}{bold} | {bold}{result['goodput_tok_s']:.0f}{bold} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def ratios(report: dict[str, Any]) -> str:
    s = report["summary"]
    oracle = report["policies"]["oracle"]["goodput_tok_s"]
    best = report["policies"][s["best_static"]]["goodput_tok_s"]
    per_phase = ", ".join(
        f"{p} {row['vs_best_static']:.3f}× / {row['vs_oracle']:.3f}×"
        for p, row in s["phases"].items()
    )
    return (
        f"goodput / best static ({s['best_static']}) = **{s['vs_best_static']:.3f}×**, "
        f"/ no-spec = **{s['vs_no_spec']:.3f}×**, / oracle = **{s['vs_oracle']:.3f}×** "
        f"(oracle / best static = {oracle / best:.3f}×); per phase vs best static / vs oracle: "
        f"{per_phase}."
    )


def steady_table() -> str:
    lines = [
        "| cell | no-spec | best static | goodput (mean k) | informed | oracle | goodput / best "
        "static | / no-spec | / oracle | oracle / best static |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in CELLS:
        r = load(name)
        p, s = r["policies"], r["summary"]
        best = p[s["best_static"]]["goodput_tok_s"]
        phase = next(iter(p["goodput"]["phases"].values()))
        informed = p.get("informed", {}).get("goodput_tok_s")
        lines.append(
            f"| {name.removeprefix('steady-')} | {p['no-spec']['goodput_tok_s']:.0f} | "
            f"{s['best_static']}: {best:.0f} | {p['goodput']['goodput_tok_s']:.0f} "
            f"({phase['mean_spec_tokens']:.1f}) | {_fmt(informed, '.0f')} | "
            f"{p['oracle']['goodput_tok_s']:.0f} | {s['vs_best_static']:.3f} | "
            f"{s['vs_no_spec']:.3f} | {s['vs_oracle']:.3f} | "
            f"{p['oracle']['goodput_tok_s'] / best:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    for name in MIXED:
        if not (HERE / f"{name}.json").exists():
            continue
        r = load(name)
        print(f"`{name}` ({r['duration_s']:.0f} s simulated; acceptance: {r['acceptance_source']};")
        print(f"cost table: `{r['cost_table']}`):\n")
        print(policy_table(r))
        print()
        print(ratios(r))
        print()
    print(steady_table())


if __name__ == "__main__":
    main()
