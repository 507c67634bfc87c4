"""Seed spread of the exact-posterior references against vLLM's rule on the 8B device scenario.

.venv/bin/python results/sim/bound_seeds.py \
    > results/sim/mixed-shift-ragged-8b-device-bound-seeds.json

Runs scenarios/mixed-shift-ragged-8b-device-bound.yaml with seeds 1-5 (seed 1 is the committed
run), only the policies kept (default: static-k7, the confidence readers, the exact-posterior
references and the oracle), and reports each seed's goodput, overall and per phase, and each
kept policy's ratio to vllm-av (vLLM's rule: k from 1), with their mean and sample standard
deviation over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from engines.cost_tables import load_cost_table
from sim.runner import build_choosers, engine_cost
from sim.scenario import load_scenario
from sim.server import SimServer
from sim.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (1, 2, 3, 4, 5)
KEEP = (
    "static-k7",
    "allocator",
    "goodput-auto",
    "vllm-av",
    "bayes-bound",
    "bayes-bound-min1",
    "bayes-prefix",
    "bayes-prefix-min1",
    "bayes-prefix-task",
    "oracle",
)
BASELINE = "vllm-av"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="scenarios/mixed-shift-ragged-8b-device-bound.yaml")
    parser.add_argument("--keep", default=",".join(KEEP), help="comma-separated policy names")
    args = parser.parse_args()
    keep = tuple(args.keep.split(","))
    if BASELINE not in keep:
        parser.error(f"--keep: the ratios need {BASELINE}")
    base = load_scenario(ROOT / args.scenario)
    table = load_cost_table(base.resolve(base.cost.table))
    known = {chooser.name for chooser in build_choosers(base, table)}
    if unknown := [name for name in keep if name not in known]:
        parser.error(f"--keep: no policy {unknown} in {args.scenario}; it has {sorted(known)}")
    runs: dict[str, Any] = {}
    for seed in SEEDS:
        scenario = base.model_copy(update={"seed": seed})
        workload = Workload(scenario)
        cost = engine_cost(scenario, table)
        figures: dict[str, Any] = {}
        for chooser in build_choosers(scenario, table):
            if chooser.name in keep:
                result = SimServer(scenario, workload, chooser, cost).run().as_dict()
                figures[chooser.name] = {
                    "goodput_tok_s": result["goodput_tok_s"],
                    "phases": {p: f["goodput_tok_s"] for p, f in result["phases"].items()},
                }
        runs[str(seed)] = figures
        print(f"seed {seed} done", file=sys.stderr)
    spread: dict[str, Any] = {}
    for name in keep:
        ratios = {
            "overall": [
                r[name]["goodput_tok_s"] / r[BASELINE]["goodput_tok_s"] for r in runs.values()
            ]
        }
        for phase in runs[str(SEEDS[0])][name]["phases"]:
            ratios[phase] = [
                r[name]["phases"][phase] / r[BASELINE]["phases"][phase] for r in runs.values()
            ]
        spread[name] = {
            where: {
                "mean": statistics.fmean(values),
                "stdev": statistics.stdev(values),
                "min": min(values),
                "max": max(values),
            }
            for where, values in ratios.items()
        }
    out = {
        "command": " ".join([".venv/bin/python results/sim/bound_seeds.py", *sys.argv[1:]]),
        "scenario": args.scenario,
        "seeds": list(SEEDS),
        "baseline": BASELINE,
        "vs_baseline": spread,
        "runs": runs,
    }
    sys.stdout.write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
