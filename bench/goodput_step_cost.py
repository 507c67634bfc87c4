"""Host time of the embedded engine's step controller per engine step (issue #13 item 3).

Replays synthetic steps (rows of mixed tasks, random accept lengths, the measured Qwen3-8B H200
cost table) through ``engines.step_controller.StepController`` exactly as the engine calls it:
``plan`` (one call per step with every row), ``record`` (the step's reports) and ``prepare``
(the next step, one step stale). Prints microseconds per step for each call at each batch
size: on a GPU ``record`` and ``prepare`` run while the device computes the step (the engine
calls them before its sync), so only ``plan`` adds to the step, and when the step was prepared
``plan`` only looks the decision up. CPU time of this thread (``thread_time``: other load on a
shared machine does not count), the best of ``--repeats`` runs.

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


def measure(batch: int, steps: int, seed: int) -> dict[str, float]:
    spec = GoodputSpec()
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
            reports.append(StepReport(k, length, [True] * (length - 1), 0.03, batch))
        t2 = time.thread_time()
        controller.record(controllers, reports)
        controller.prepare(views, controllers)
        t3 = time.thread_time()
        if step >= warm:
            spent["plan"] += t1 - t0
            spent["record"] += t3 - t2  # record + prepare: behind the device's step
    n = steps - warm
    return {"plan_us": 1e6 * spent["plan"] / n, "record_prepare_us": 1e6 * spent["record"] / n}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    out: dict[str, Any] = {"command": "python " + " ".join(sys.argv), "batch": {}}
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        runs = [measure(batch, args.steps, seed) for seed in range(args.repeats)]
        best = {key: min(r[key] for r in runs) for key in runs[0]}
        out["batch"][str(batch)] = best
        print(
            f"batch {batch:3d}: plan {best['plan_us']:7.1f} us/step (on the step's path), "
            f"record+prepare {best['record_prepare_us']:7.1f} us/step (behind the device)"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
