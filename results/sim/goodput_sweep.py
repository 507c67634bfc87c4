"""One goodput-policy key swept over seeds of single-engine scenarios: how a setting was chosen.

.venv/bin/python results/sim/goodput_sweep.py --key plain_step_age --values 0,0.1,0.25,1 \
    --scenarios steady-chat-c64,steady-code-c64,mixed-shift-b16,mixed-shift-32b \
    --seeds 11,12,13,14,15 > results/sim/plain-step-age-sweep.json

Each scenario (``scenarios/NAME.yaml``) runs once per seed with its own goodput settings, the
key set to each value (every other policy of the scenario is left out: they do not read it).
Reports goodput tok/s per (scenario, value, seed) (with ``--with-static`` also that seed's
best static k) and, per scenario and value, the mean and sample standard deviation over the
seeds of its ratio to the first value's run of the same seed (paired: the same requests).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from sim.runner import run_scenario
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def _numbers(text: str, kind: type, flag: str, parser: argparse.ArgumentParser) -> list[Any]:
    try:
        return [kind(part) for part in text.split(",") if part]
    except ValueError:
        parser.error(f"{flag}: comma-separated {kind.__name__}s, got {text!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--key", required=True, help="a goodput policy key, e.g. plain_step_age")
    parser.add_argument("--values", required=True, help="comma-separated values of the key")
    parser.add_argument("--scenarios", required=True, help="comma-separated names in scenarios/")
    parser.add_argument("--seeds", default="11,12,13,14,15", help="comma-separated seeds")
    parser.add_argument(
        "--with-static", action="store_true", help="also run the static policies (slower)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another goodput key held at VALUE in every run (repeatable), e.g. "
        "shared_calibration=1 while --key sweeps calibration_half_life_steps; a list "
        "with / between its items, e.g. request_strength_choices=1/2/4",
    )
    args = parser.parse_args()
    fixed: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set: KEY=VALUE, got {item!r}")
        fixed[key] = value.split("/") if "/" in value else value  # a list: 1/2/4
    values = _numbers(args.values, float, "--values", parser)
    seeds = _numbers(args.seeds, int, "--seeds", parser)
    names = [n for n in args.scenarios.split(",") if n]
    runs: dict[str, Any] = {}
    spread: dict[str, Any] = {}
    for name in names:
        base = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
        for key in (args.key, *fixed):
            if key not in type(base.policies.goodput).model_fields:
                parser.error(f"the goodput policy has no key {key!r}")
        statics = base.policies.static_spec_tokens if args.with_static else []
        runs[name] = {}
        for value in values:
            # validated, so a value is coerced to the key's type (an int key from "8")
            spec = base.policies.goodput
            goodput = type(spec).model_validate(spec.model_dump() | fixed | {args.key: value})
            policies = base.policies.model_copy(
                update={
                    "static_spec_tokens": statics,
                    "goodput": goodput,
                    "include_oracle": False,
                    "include_informed": False,
                }
            )
            per_seed = {}
            for seed in seeds:
                scenario = base.model_copy(update={"seed": seed, "policies": policies})
                report = run_scenario(scenario)["policies"]
                per_seed[str(seed)] = {
                    "goodput_tok_s": report["goodput"]["goodput_tok_s"],
                    "best_static_tok_s": max(
                        (p["goodput_tok_s"] for n, p in report.items() if n.startswith("static-")),
                        default=None,
                    ),
                }
                print(f"{name} {args.key}={value} seed {seed} done", file=sys.stderr)
            runs[name][str(value)] = per_seed
        first = runs[name][str(values[0])]
        spread[name] = {}
        for value in values:
            ratios = [
                runs[name][str(value)][s]["goodput_tok_s"] / first[s]["goodput_tok_s"]
                for s in first
            ]
            spread[name][str(value)] = {
                f"vs_{args.key}_{values[0]}": {
                    "mean": statistics.fmean(ratios),
                    "stdev": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
                }
            }
    out = {
        "command": " ".join([".venv/bin/python results/sim/goodput_sweep.py", *sys.argv[1:]]),
        "key": args.key,
        "values": values,
        "fixed": fixed,
        "seeds": seeds,
        "spread": spread,
        "runs": runs,
    }
    sys.stdout.write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
