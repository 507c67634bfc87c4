"""Results: per policy mean and spread over repeats, per phase, and the results file that other
checks read (issue #13): ``{"engine", "command", "arms": {ARM: {"policies": {NAME:
{"tok_s_mean", "tok_s_spread", "repeats", "phases": {PHASE: {"tok_s_mean",
"mean_spec_tokens", "step_ms_mean"}}}}}}}``. Spread = (max - min) / 2 over repeats."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _spread(values: Sequence[float]) -> float:
    return (max(values) - min(values)) / 2 if len(values) > 1 else 0.0


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def summarise(runs: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    for name in names:
        mine = [r for r in runs if r["policy"] == name]
        if not mine:
            continue
        totals = [r["tok_s"] for r in mine]
        phases: dict[str, Any] = {}
        for phase in mine[0]["phases"]:
            cells = [r["phases"][phase] for r in mine]
            phases[phase] = {
                "tok_s_mean": _mean([c["tok_s"] for c in cells]),
                "tok_s_spread": _spread([c["tok_s"] for c in cells]),
                "mean_spec_tokens": _mean([c["mean_spec_tokens"] for c in cells]),
                "step_ms_mean": _mean([c["step_ms_mean"] for c in cells]),
                "host_us_per_step": _mean([c["host_us_per_step"] for c in cells]),
                "decode_tok_s_mean": _mean([c.get("decode_tok_s") for c in cells]),
                "accept_length_by_task": cells[-1]["accept_length_by_task"],
            }
        policies[name] = {
            "tok_s_mean": statistics.fmean(totals),
            "tok_s_spread": _spread(totals),
            "tok_s_runs": totals,
            "repeats": len(mine),
            "phases": phases,
        }
    return {"policies": policies, "ratios": _ratios(policies)}


def _ratios(policies: dict[str, Any]) -> dict[str, Any]:
    """goodput against the baselines the targets name, overall and per phase."""
    if "goodput" not in policies:
        return {}
    goodput = policies["goodput"]
    static = {n: p for n, p in policies.items() if n.startswith("static-k")}
    out: dict[str, Any] = {}
    if static:
        best = max(static, key=lambda n: static[n]["tok_s_mean"])
        out["best_static_overall"] = best
        out["vs_best_static"] = goodput["tok_s_mean"] / static[best]["tok_s_mean"]
    for name in ("static-k15", "vllm-av", "dsd-schedule", "no-spec", "oracle"):
        if name in policies:
            out[f"vs_{name}"] = goodput["tok_s_mean"] / policies[name]["tok_s_mean"]
    per_phase: dict[str, Any] = {}
    for phase, cell in goodput["phases"].items():
        statics = {n: p["phases"][phase]["tok_s_mean"] for n, p in static.items()}
        entry: dict[str, Any] = {}
        if statics:
            best = max(statics, key=lambda n: statics[n])
            entry = {"best_static": best, "vs_best_static": cell["tok_s_mean"] / statics[best]}
        if "no-spec" in policies:
            plain = policies["no-spec"]["phases"][phase]["tok_s_mean"]
            entry["vs_no_spec"] = cell["tok_s_mean"] / plain
        per_phase[phase] = entry
    out["phases"] = per_phase
    return out


def merge(paths: Sequence[Path]) -> dict[str, Any]:
    """The results file from one JSON per arm (each arm's own command kept with it)."""
    arms: dict[str, Any] = {}
    for path in paths:
        report = json.loads(path.read_text())
        arms[report["arm"]] = {
            "command": report["command"],
            "device": report["device"],
            "policies": report["summary"]["policies"],
            "ratios": report["summary"]["ratios"],
            **({"exactness": report["exactness"]} if "exactness" in report else {}),
        }
    commands = "; ".join(a["command"] for a in arms.values())
    return {"engine": "padded", "command": commands, "arms": arms}
