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

Since session 17 also with the traffic the H200 showed (static-k7's 64-row steps in the
narrow-draft calls, `bench/results/gpu_decisions/*_2026-12-03n1.json.gz`): per-step noise
correlated in time (AR(1), lag-1 autocorrelation ``--rho``, 0.3 there), a rate that falls
over each phase (``--drifts``, ``--drift-shape``: the closed loop's running mix lost ~9% at
60% of the phase as requests that accept long runs finished first), a batch that drains from
64 to 33 rows over the last ``--drain`` share of each phase, and a bucket that lives through
``--cycles`` phases (a server's, or the warm protocol's). The commands behind
`bench/results/step_mode_mc_2026-12-03_*.json` are in docs/allocator.md ("Paired blocks");
``--reprobe`` and ``--pair-decay`` set the chooser's.

An assumption, not a measurement: the GPU arms measure the chosen setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
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
STEP_S = 0.028  # at 64 rows
# A step of r rows takes STEP_S * (FIXED + (1 - FIXED) r / 64): on the H200 8B ragged arm
# k = 7 steps took ~19 ms at 33 rows and ~23 ms at 64 (bench/results/gpu_decisions_ragged.json).
FIXED = 0.64


def share_of_best(
    settings: ModeSettings,
    gap: float,
    noise: float,
    steps: int,
    seed: int,
    drift: float = 0.0,
    rho: float = 0.0,
    shape: str = "linear",
    cycles: int = 1,
    drain: float = 0.0,
) -> float:
    """The chooser's tokens over running the faster mode at every step, on the same traffic.
    The bucket's life is ``cycles`` phases of ``steps / cycles`` steps; in each, step t's rate
    is the mode's times ``1 - drift * t / L`` (``shape`` linear; step: the whole fall at 60%
    of the phase) times noise of sd ``noise`` (AR(1), lag-1 autocorrelation ``rho``), and in
    the last ``drain`` share of the phase its rows fall from 64 to 33 (a closed loop's end:
    fewer rows emit fewer tokens per step, in less time: ``FIXED``)."""
    rng = random.Random(seed)
    chooser = StepModeChooser(settings)
    tokens = best_tokens = 0.0
    shock = 0.0
    innovation = noise * math.sqrt(1.0 - rho * rho)
    life = max(1, steps // cycles)
    for t in range(steps):
        u = (t % life) / life
        rows = ROWS if u < 1.0 - drain else round(ROWS - (ROWS - 33) * (u - 1.0 + drain) / drain)
        two_phase = chooser.decide(rows)
        shock = rho * shock + rng.gauss(0.0, innovation)
        fall = (u >= 0.6) if shape == "step" else u
        traffic = (1.0 - drift * fall) * max(0.1, 1.0 + shock) * rows / ROWS
        rate = (1.0 - gap if two_phase else 1.0) * traffic
        step_s = STEP_S * (FIXED + (1 - FIXED) * rows / ROWS)
        chooser.record(rows, two_phase, int(TOKENS * rate), step_s)
        tokens += TOKENS * rate
        best_tokens += TOKENS * max(1.0, 1.0 - gap) * traffic
    return tokens / best_tokens


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument(
        "--settings",
        default=";".join(f"{p},{learn}" for p, learn in SETTINGS),
        help="probe_steps,learn_steps;... (default: %(default)s)",
    )
    parser.add_argument("--gaps", type=_floats, default=GAPS, help="two-phase's loss, e.g. 0.07")
    parser.add_argument("--noises", type=_floats, default=NOISES, help="per-step sd of the rate")
    parser.add_argument("--lifetimes", default=",".join(map(str, LIFETIMES)), help="steps")
    parser.add_argument(
        "--drifts", type=_floats, default=(0.0,), help="the rate's fall over a life"
    )
    parser.add_argument("--rho", type=float, default=0.0, help="noise's lag-1 autocorrelation")
    parser.add_argument(
        "--drift-shape",
        choices=("linear", "step"),
        default="linear",
        help="the fall spread over the life, or all of it at 60%% of the life (as on the H200)",
    )
    parser.add_argument("--cycles", type=int, default=1, help="phases in a bucket's life")
    parser.add_argument("--drain", type=float, default=0.0, help="share of a phase draining")
    parser.add_argument(
        "--reprobe", type=int, default=ModeSettings().reprobe_steps, help="reprobe_steps"
    )
    parser.add_argument(
        "--pair-decay",
        type=float,
        default=getattr(ModeSettings(), "pair_decay", 0.8),
        help="pair_decay",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    lifetimes = [int(x) for x in args.lifetimes.split(",")]
    settings_grid = [tuple(int(x) for x in pair.split(",")) for pair in args.settings.split(";")]
    cells: dict[str, dict[str, float]] = {}
    tails: dict[str, dict[str, float]] = {}  # the 5th percentile over seeds: lock-ins show here
    for probe, learn in settings_grid:
        name = f"probe {probe}, learn {learn}"
        cells[name] = {}
        tails[name] = {}
        settings = ModeSettings(probe_steps=probe, learn_steps=learn, reprobe_steps=args.reprobe)
        # A chooser from before session 17 has no pair_decay: the script also runs against
        # ba615a9's policies/step_mode.py for the pooled rows of docs/allocator.md's table.
        if hasattr(settings, "pair_decay"):
            settings = dataclasses.replace(settings, pair_decay=args.pair_decay)
        for gap in args.gaps:
            for noise in args.noises:
                for drift in args.drifts:
                    for steps in lifetimes:
                        runs = [
                            share_of_best(
                                settings,
                                gap,
                                noise,
                                steps,
                                s,
                                drift,
                                args.rho,
                                args.drift_shape,
                                args.cycles,
                                args.drain,
                            )
                            for s in range(args.seeds)
                        ]
                        key = f"gap {gap:+.2f} noise {noise:.2f} steps {steps}"
                        if args.drifts != (0.0,):
                            key += f" drift {drift:.2f}"
                        cells[name][key] = statistics.fmean(runs)
                        tails[name][key] = sorted(runs)[len(runs) // 20]
        worst = min(cells[name].values())
        short = statistics.fmean(
            v for k, v in cells[name].items() if f"steps {lifetimes[0]} " in f"{k} "
        )
        print(
            f"{name:18s}: worst cell {worst:.4f}, mean over the {lifetimes[0]}-step cells "
            f"{short:.4f}, worst 5th percentile {min(tails[name].values()):.4f}"
        )
    if args.json:
        report = {
            "command": "python " + " ".join(sys.argv),
            "seeds": args.seeds,
            "cells": cells,
            "p5": tails,
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
