"""How long the auto step mode should measure before it commits (issue 16): a Monte Carlo of
``policies.step_mode.StepModeChooser`` on one batch-size bucket.

Each step the chooser picks one-phase or two-phase; the step then emits tokens at the mode's
rate times iid noise (``1 - gap`` for two-phase: a positive gap means one-phase is faster),
and the run's tokens per second is compared with always running the faster mode. The grid:
gaps of +7% (two-phase's loss at 64 rows on the H200 8B ragged arm, 2026-12-02 call i:
goodput-slots' decode 7,144 against 7,672 for k = 7), +2% and -5%; per-step noise 8, 15 and 25%
of the rate (64 rows emitting ~4.5 tokens each, sd ~3, give ~8%); buckets that live 95 steps
(the trace's 64-row phase at ``--scale 0.5``) or 2,000. Prints and writes, per setting, the
mean over seeds of the share of the best mode's rate, and the worst cell of each setting.

    .venv/bin/python bench/step_mode_mc.py [--seeds 300] [--json bench/results/step_mode_mc.json]

An assumption, not a measurement: real per-step rates are correlated in time (the same rows
step after step) and traffic drifts; the GPU arms measure the chosen setting.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.step_mode import ModeSettings, StepModeChooser

SETTINGS = ((16, 32), (8, 16), (8, 24), (4, 16))  # (probe_steps, learn_steps)
GAPS = (0.07, 0.02, -0.05)
NOISES = (0.08, 0.15, 0.25)
LIFETIMES = (95, 2000)
ROWS = 64
TOKENS = 300.0  # per one-phase step at rate 1
STEP_S = 0.028


def share_of_best(settings: ModeSettings, gap: float, noise: float, steps: int, seed: int) -> float:
    rng = random.Random(seed)
    chooser = StepModeChooser(settings)
    tokens = seconds = 0.0
    for _ in range(steps):
        two_phase = chooser.decide(ROWS)
        rate = (1.0 - gap if two_phase else 1.0) * max(0.1, rng.gauss(1.0, noise))
        chooser.record(ROWS, two_phase, int(TOKENS * rate), STEP_S)
        tokens += TOKENS * rate
        seconds += STEP_S
    best = max(1.0, 1.0 - gap)
    return (tokens / seconds) / (best * TOKENS / STEP_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    cells: dict[str, dict[str, float]] = {}
    for probe, learn in SETTINGS:
        name = f"probe {probe}, learn {learn}"
        cells[name] = {}
        for gap in GAPS:
            for noise in NOISES:
                for steps in LIFETIMES:
                    settings = ModeSettings(probe_steps=probe, learn_steps=learn)
                    runs = [
                        share_of_best(settings, gap, noise, steps, s) for s in range(args.seeds)
                    ]
                    key = f"gap {gap:+.2f} noise {noise:.2f} steps {steps}"
                    cells[name][key] = statistics.fmean(runs)
        worst = min(cells[name].values())
        short = statistics.fmean(v for k, v in cells[name].items() if k.endswith("steps 95"))
        print(f"{name:18s}: worst cell {worst:.4f}, mean over the 95-step cells {short:.4f}")
    if args.json:
        report = {"command": "python " + " ".join(sys.argv), "seeds": args.seeds, "cells": cells}
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
