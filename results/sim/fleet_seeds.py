"""Seed spread of the fleet-mixed-shift ratios: the deployable fleets on other requests.

.venv/bin/python results/sim/fleet_seeds.py > results/sim/fleet-mixed-shift-seeds.json
.venv/bin/python results/sim/fleet_seeds.py --scenario scenarios/fleet-mixed-shift-ragged.yaml \
    --keep uniform-no-spec,uniform-static-k5,uniform-static-k7,uniform-schedule,\
draftctl-routed-ragged-spill1 > results/sim/fleet-mixed-shift-ragged-seeds.json

Runs a fleet scenario (default scenarios/fleet-mixed-shift.yaml) with seeds 1-5 (seed 1 is the
committed run), only the fleets kept (default: leaving out the slow bounds and vLLM-AV), and
reports each seed's goodput and the ratios the issue's targets name for the pooled fleets,
with their mean and sample standard deviation over the seeds.
"""

from __future__ import annotations

import argparse
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="scenarios/fleet-mixed-shift.yaml")
    parser.add_argument("--keep", default=",".join(KEEP), help="comma-separated fleet names")
    args = parser.parse_args()
    keep = tuple(args.keep.split(","))
    base = load_scenario(ROOT / args.scenario)
    known = {layout.name for layout in layouts_of(base)}
    if unknown := [name for name in keep if name not in known]:
        parser.error(f"--keep: no fleet {unknown} in {args.scenario}; it has {sorted(known)}")
    if "uniform-no-spec" not in keep or not any(n.startswith("uniform-static-k") for n in keep):
        parser.error("--keep: the ratios need uniform-no-spec and a uniform-static-k fleet")
    runs: dict[str, Any] = {}
    for seed in SEEDS:
        scenario = base.model_copy(update={"seed": seed})
        layouts = [layout for layout in layouts_of(scenario) if layout.name in keep]
        report = run_fleets(scenario, layouts=layouts)
        runs[str(seed)] = {
            "goodput_tok_s": {n: f["goodput_tok_s"] for n, f in report["fleets"].items()},
            "summary": report["summary"],
        }
        print(f"seed {seed} done", file=sys.stderr)
    spread: dict[str, Any] = {}
    pooled = [name for name in keep if not name.startswith("uniform-")]
    for fleet in pooled:
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
        "command": " ".join([".venv/bin/python results/sim/fleet_seeds.py", *sys.argv[1:]]),
        "scenario": args.scenario,
        "seeds": list(SEEDS),
        "spread": spread,
        "runs": runs,
    }
    sys.stdout.write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
