"""Seed spread of the fleet-mixed-shift ratios: the deployable fleets on other requests.

.venv/bin/python results/sim/fleet_seeds.py > results/sim/fleet-mixed-shift-seeds.json

Runs scenarios/fleet-mixed-shift.yaml with seeds 1-5 (seed 1 is the committed run), leaving out
the slow bounds and vLLM-AV, and reports each seed's goodput and the ratios the issue's
targets name, with their mean and sample standard deviation over the seeds.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from sim.fleet_runner import layouts_of, run_fleets
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (1, 2, 3, 4, 5)
KEEP = (
    "uniform-no-spec",
    "uniform-static-k5",
    "uniform-static-k7",
    "uniform-schedule",
    "draftctl-routed",
    "draftctl-routed-spill1",
    "task-pools-no-spill",
    "task-pools-static",
)
RATIOS = ("vs_best_uniform_static", "vs_uniform_schedule", "min_phase_vs_no_spec")


def main() -> None:
    base = load_scenario(ROOT / "scenarios" / "fleet-mixed-shift.yaml")
    runs: dict[str, Any] = {}
    for seed in SEEDS:
        scenario = base.model_copy(update={"seed": seed})
        layouts = [layout for layout in layouts_of(scenario) if layout.name in KEEP]
        report = run_fleets(scenario, layouts=layouts)
        runs[str(seed)] = {
            "goodput_tok_s": {n: f["goodput_tok_s"] for n, f in report["fleets"].items()},
            "summary": report["summary"],
        }
        print(f"seed {seed} done", file=sys.stderr)
    spread: dict[str, Any] = {}
    for fleet in KEEP[4:]:
        spread[fleet] = {}
        for ratio in RATIOS:
            values = [run["summary"][fleet][ratio] for run in runs.values()]
            spread[fleet][ratio] = {
                "mean": statistics.fmean(values),
                "stdev": statistics.stdev(values),
                "min": min(values),
                "max": max(values),
            }
    out = {
        "command": ".venv/bin/python results/sim/fleet_seeds.py",
        "scenario": "scenarios/fleet-mixed-shift.yaml",
        "seeds": list(SEEDS),
        "spread": spread,
        "runs": runs,
    }
    sys.stdout.write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
