"""Goodput's tok/s on single-engine scenarios over seeds, for an A/B of two code trees.

Run once per tree, each on its own code (a git worktree of the older commit for A):

    cd /tmp/old && PYTHONPATH=/tmp/old python /work/main/results/sim/code_ab.py \\
        mixed-shift-host-overhead,steady-math-c64 > a.json
    cd /work/main && PYTHONPATH=. python results/sim/code_ab.py \\
        mixed-shift-host-overhead,steady-math-c64 > b.json

Each scenario (``scenarios/NAME.yaml`` of this repository) runs with only the goodput policies
(``goodput`` and, where the scenario includes it, ``goodput-auto``; no static k, oracle,
informed, allocator or vLLM policy) at each of ``--seeds``; prints ``{"code": COMMIT, "runs":
{"NAME/SEED[/POLICY]": {"goodput_tok_s", "phases": {PHASE: tok/s}}}}`` (POLICY when not
``goodput``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from sim.runner import run_scenario
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenarios", help="comma-separated names in scenarios/")
    parser.add_argument("--seeds", default="11,12,13,14,15", help="comma-separated seeds")
    args = parser.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    code = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    runs = {}
    for name in [n for n in args.scenarios.split(",") if n]:
        path = ROOT / "scenarios" / f"{name}.yaml"
        if not path.is_file():
            parser.error(f"no scenario {path}")
        base = load_scenario(path)
        others = ("oracle", "informed", "allocator", "vllm_av", "allocator_gated")
        policies = base.policies.model_copy(
            update={
                "static_spec_tokens": [],
                "include_allocator_prior": False,
                **{f"include_{name}": False for name in others},
            }
        )
        for seed in seeds:
            scenario = base.model_copy(update={"seed": seed, "policies": policies})
            for policy, report in run_scenario(scenario)["policies"].items():
                if not policy.startswith("goodput"):
                    continue
                key = f"{name}/{seed}" if policy == "goodput" else f"{name}/{seed}/{policy}"
                runs[key] = {
                    "goodput_tok_s": report["goodput_tok_s"],
                    "phases": {p: v["goodput_tok_s"] for p, v in report.get("phases", {}).items()},
                }
                print(f"{key}: {report['goodput_tok_s']:.1f} tok/s", file=sys.stderr)
    print(json.dumps({"code": code, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
