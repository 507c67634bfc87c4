"""Host time of the embedded engine's step controller per engine step (issue #13 item 3).

Replays synthetic steps (rows of mixed tasks, random accept lengths, the measured Qwen3-8B H200
cost table) through ``engines.step_controller.StepController`` exactly as the engine calls it:
``plan`` (one call per step with every row), ``record`` (the step's reports) and ``prepare``
(the next step, one step stale). Prints microseconds per step for each call at each batch
size: on a GPU ``record`` and ``prepare`` run while the device computes the step (the engine
calls them before its sync), so only ``plan`` adds to the step, and when the step was prepared
``plan`` only looks the decision up. CPU time of this thread (``thread_time``: other load on a
shared machine does not count), the best of ``--repeats`` runs.

A small target's step is host-bound (a few ms; the device waits for the host), so there the
controller's whole host time counts. Its decisions are then spaced while the batch keeps its
rows (``max_replan_steps``, ``host_budget``: engines/step_controller.py), which the figures show
twice: deciding every step (``max_replan_steps: 1``) and as configured, with each step reporting
``--step-ms`` of device time (default: the testbed pair's H200 decode steps).

    .venv/bin/python bench/goodput_step_cost.py [--batch-sizes 1,8,64] [--steps 400] [--json F]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.cost_tables import load_cost_table
from engines.embedded.events import RequestView, StepReport
from engines.step_controller import FixedPolicySource, RequestSteps, StepController
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec, PolicySpec
from policies.online import OnlineModels
from policies.types import Task

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "cost_tables/qwen3-8b-h200.json"
DRAWN_TASKS = [Task.MATH, Task.CODE, Task.CHAT]
DRAWN_WEIGHTS = [0.4, 0.2, 0.4]  # the GPU trace's mixed phase


def measure(
    batch: int,
    steps: int,
    seed: int,
    step_s: float = 0.03,
    replan: int | None = None,
    churn: str | None = None,
) -> dict[str, float]:
    """``churn``: one request of the batch replaced by a new one every step (a busy server).
    ``"cycle"``: the new request's task is the next in turn (math, code, chat, ...), so the
    batch's task mix moves every step; ``"drawn"``: drawn from the mixed phase's traffic
    (math 0.4, code 0.2, chat 0.4), so the mix often stays (a request replaced by one of its
    task) and otherwise moves by one row."""
    spec = GoodputSpec() if replan is None else GoodputSpec(max_replan_steps=replan)
    models = OnlineModels(spec, 16, load_cost_table(TABLE))
    source = FixedPolicySource(
        PolicySpec(kind="goodput", goodput=spec), GoodputPolicy(spec), models
    )
    controller = StepController(source, 16, random.Random(seed))
    rng = random.Random(seed)
    rows: list[tuple[str, RequestSteps, list[int], list[int]]] = [
        (f"r{i}", controller.start(list(Task)[i % 3], 1.0, 0), [], []) for i in range(batch)
    ]
    spent = {"plan": 0.0, "record": 0.0, "prepare": 0.0}
    warm = steps // 4
    for step in range(steps):
        if churn is not None and batch > 1:
            if churn == "cycle":
                task = list(Task)[step % 3]
            else:
                task = rng.choices(DRAWN_TASKS, DRAWN_WEIGHTS)[0]
            rows[step % batch] = (f"n{step}", controller.start(task, 1.0, 0), [], [])
        views = [RequestView(rid, len(a), a, batch, 0, {}, ks, 15) for rid, _, a, ks in rows]
        controllers = [steps_ for _, steps_, _, _ in rows]
        t0 = time.thread_time()
        ks_now = controller.plan(views, controllers)
        t1 = time.thread_time()
        reports = []
        for (_, _, accepts, ks), k in zip(rows, ks_now, strict=True):
            length = min(k, rng.randint(0, 15)) + 1
            accepts.append(length)
            ks.append(k)
            reports.append(StepReport(k, length, [True] * (length - 1), step_s, batch))
        t2 = time.thread_time()
        controller.record(controllers, reports)
        controller.prepare(views, controllers)
        t3 = time.thread_time()
        if step >= warm:
            spent["plan"] += t1 - t0
            spent["record"] += t3 - t2  # record + prepare: behind the device's step
    n = steps - warm
    return {
        "plan_us": 1e6 * spent["plan"] / n,
        "record_prepare_us": 1e6 * spent["record"] / n,
        "decisions_per_step": controller.decisions / steps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--step-ms",
        default="1:2.5,8:3.5,64:9.0",
        help="BATCH:MS,... device time each step reports (default: the testbed pair on the H200)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    out: dict[str, Any] = {"command": "python " + " ".join(sys.argv), "batch": {}}
    step_ms = {int(b): float(ms) for b, ms in (p.split(":") for p in args.step_ms.split(","))}
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        step_s = step_ms.get(batch, 30.0) / 1e3
        figures: dict[str, Any] = {"step_ms": step_s * 1e3}
        for label, replan, churn in (
            ("every_step", 1, None),
            ("spaced", None, None),
            ("churn", None, "cycle"),
            ("churn_drawn", None, "drawn"),
        ):
            runs = [
                measure(batch, args.steps, seed, step_s, replan, churn)
                for seed in range(args.repeats)
            ]
            best = {key: min(r[key] for r in runs) for key in runs[0]}
            figures[label] = best
            total = best["plan_us"] + best["record_prepare_us"]
            print(
                f"batch {batch:3d} ({label:11s}): plan {best['plan_us']:6.1f} us/step (on the "
                f"step's path), record+prepare {best['record_prepare_us']:6.1f} us/step "
                f"(behind the device), decisions/step {best['decisions_per_step']:.2f}, "
                f"all {100 * total / (step_s * 1e6):.1f}% of a {step_s * 1e3:.1f} ms step"
            )
        out["batch"][str(batch)] = figures
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
