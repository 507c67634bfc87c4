"""How well the allocator and vLLM's estimator rank the same simulated steps' draft slots.

``bench/survival_replay.py`` replays recorded or generated steps in lockstep batches; this
reads the simulator's own steps instead, as a scenario runs them (arrivals, admissions, rows
finishing, the live task mix, the closed loop). One policy drives the simulation
(``--driver``: ``allocator`` or ``vllm-av``, as the scenario builds them); the other scores
every step's rows beside it (a shadow: it sees the same rows, their histories and their
synthetic draft confidence, learns from the same outcomes, and decides nothing). At each
step of at least ``--min-rows`` rows both policies' survival estimates rank the step's
(row, position) slots, and the best D are checked against the rows' true accepted runs (the
simulator's lookahead), for D = the step's true survivors (``oracle``: the budget only a
clairvoyant knows, as the replay's), D = what the driver verified that step (``driver``), and
each ``--budget`` given. Reported per D: accepted drafts per step for each policy and their
ratio (allocator / vLLM).

    S=scenarios/mixed-shift-ragged-8b-device
    .venv/bin/python bench/sim_scoring.py --scenario $S-kmin1.yaml --driver allocator \\
      --budget 336 --out bench/results/sim_scoring_ragged_8b_kmin1_allocator.json

About 30 s a scenario on a laptop (the driver's simulation plus the shadow's scoring).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engines.cost_tables import load_cost_table  # noqa: E402
from policies.slot_allocator import sigmoid  # noqa: E402
from sim.request import SimRequest  # noqa: E402
from sim.runner import build_choosers, engine_cost  # noqa: E402
from sim.scenario import load_scenario  # noqa: E402
from sim.server import SimServer  # noqa: E402
from sim.workload import Workload  # noqa: E402

POLICIES = ("allocator", "vllm-av")


def allocator_survival(chooser: Any) -> np.ndarray:
    """[rows, K] survival the allocator scored its last step with."""
    scored = chooser._allocator._scored
    assert scored is not None, "the allocator scored a step"
    return np.cumprod(sigmoid(scored.logit), axis=1)


def vllm_survival(chooser: Any) -> np.ndarray:
    """[rows, K] survival vLLM's estimator scored its last step with (its EMA where a row
    had no confidence, as its ``_score``)."""
    policy = chooser._policy
    scored = policy._scored
    assert scored is not None, "vLLM's estimator scored a step"
    survival = np.tile(policy.ema.survival, (len(scored.has_confidence), 1))
    has = scored.has_confidence
    survival[has] = np.cumprod(scored.predictions[has], axis=1)
    return survival


def shadow_scores(chooser: Any, batch: Sequence[SimRequest]) -> np.ndarray:
    """The shadow scores the batch (and learns from the rows' outcomes so far)."""
    if chooser.name.startswith("allocator"):
        chooser._allocator.decide_rows(chooser._rows(batch), len(batch), chooser._rates)
        return allocator_survival(chooser)
    chooser._policy.decide_rows(chooser._rows(batch), len(batch))
    return vllm_survival(chooser)


class Tally:
    """Accepted drafts of each policy's best D slots, summed over the steps watched."""

    def __init__(self, budgets: Sequence[int]):
        self.budgets = list(budgets)
        self.steps = 0
        self.survivors = 0
        self.accepted: dict[str, dict[str, float]] = {}
        self.rows_by_task: dict[str, int] = {}

    def add(
        self,
        survive: np.ndarray,
        scores: dict[str, np.ndarray],
        driver_d: int,
        tasks: Sequence[str] = (),
    ) -> None:
        total = int(survive.sum())
        self.steps += 1
        self.survivors += total
        for task in tasks:
            self.rows_by_task[task] = self.rows_by_task.get(task, 0) + 1
        named = {"oracle": total, "driver": driver_d, **{str(d): d for d in self.budgets}}
        flat = survive.ravel()
        for label, d in named.items():
            row = self.accepted.setdefault(label, dict.fromkeys(scores, 0.0))
            for name, score in scores.items():
                order = np.argsort(-score.ravel(), kind="stable")[: max(0, d)]
                row[name] += float(flat[order].sum())

    def summary(self) -> dict[str, Any]:
        n = max(self.steps, 1)
        budgets = {}
        for label, row in self.accepted.items():
            per_step = {name: round(v / n, 2) for name, v in row.items()}
            vllm = row.get("vllm-av", 0.0)
            ratio = row.get("allocator", 0.0) / vllm if vllm else None
            budgets[label] = {**per_step, "allocator_over_vllm": ratio and round(ratio, 4)}
        rows = max(sum(self.rows_by_task.values()), 1)
        return {
            "steps": self.steps,
            "true_survivors_per_step": round(self.survivors / n, 2),
            # the live batch's task mix over the steps watched (the driver's closed loop
            # sets it: requests a policy serves faster leave the batch sooner)
            "row_share_by_task": {
                task: round(count / rows, 4) for task, count in sorted(self.rows_by_task.items())
            },
            "budgets": budgets,
        }


def run(scenario_path: Path, driver: str, min_rows: int, budgets: Sequence[int]) -> dict[str, Any]:
    scenario = load_scenario(scenario_path)
    table = load_cost_table(scenario.resolve(scenario.cost.table))
    by_name = {c.name: c for c in build_choosers(scenario, table)}
    missing = [p for p in POLICIES if p not in by_name]
    if missing:
        raise ValueError(
            f"{scenario_path}: the scenario builds no {', '.join(missing)} "
            "(policies.include_allocator / include_vllm_av, and acceptance.confidence_auc)"
        )
    drives, shadow = by_name[driver], by_name[POLICIES[1 - POLICIES.index(driver)]]
    positions = drives._k
    tally = Tally(budgets)
    inner = drives.choose

    def choose(batch: Sequence[SimRequest], now_s: float) -> list[int]:
        ks: list[int] = inner(batch, now_s)
        if len(batch) >= min_rows:
            own = allocator_survival(drives) if driver == "allocator" else vllm_survival(drives)
            other = shadow_scores(shadow, batch)
            runs = np.array([r.peek_accepted(positions) for r in batch])
            survive = runs[:, None] > np.arange(positions)[None, :]
            tasks = [r.spec.task.value for r in batch]
            tally.add(survive, {driver: own, shadow.name: other}, int(sum(ks)), tasks)
        return ks

    drives.choose = choose  # the instance's attribute: the server calls it each step
    report = SimServer(scenario, Workload(scenario), drives, engine_cost(scenario, table)).run()
    return {
        "scenario": scenario.name,
        "driver": driver,
        "min_rows": min_rows,
        "driver_goodput_tok_s": round(report.as_dict()["goodput_tok_s"], 1),
        **tally.summary(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", type=Path, required=True)
    parser.add_argument("--driver", choices=POLICIES, default="allocator")
    parser.add_argument(
        "--min-rows", type=int, default=64, help="watch steps of at least this many rows"
    )
    parser.add_argument(
        "--budget", type=int, action="append", default=[], help="also rank at this D (repeat)"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.min_rows < 1 or any(d < 0 for d in args.budget):
        parser.error("--min-rows must be >= 1 and every --budget >= 0")
    try:
        result = run(args.scenario, args.driver, args.min_rows, args.budget)
    except (OSError, ValueError) as exc:
        print(f"sim_scoring: {exc}", file=sys.stderr)
        return 2
    command = ["python", "bench/sim_scoring.py", "--scenario", str(args.scenario)]
    command += ["--driver", args.driver, "--min-rows", str(args.min_rows)]
    command += [f"--budget={d}" for d in args.budget]
    result = {"command": " ".join(command), **result}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
