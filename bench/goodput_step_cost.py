"""Host time of the goodput controller per engine step: per-request decisions vs one per batch.

The embedded engine asks its spec controller once per row before every step, on the engine
thread; that time adds to every step's wall clock. This replays synthetic steps (rows of mixed
tasks, random accept lengths, the measured Qwen3-8B H200 cost table) through
``policies.step_controller.StepController`` both ways and prints microseconds per engine step
(all rows' calls) and per row, and the time of feeding the step reports back (``record``, on
the event loop in the engine; the same process). CPU time of this process (``process_time``,
so other load on a shared machine does not count), the best of ``--repeats`` runs.

    .venv/bin/python bench/goodput_step_cost.py [--batch-sizes 1,8,64] [--steps 400] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.step_controller import StepController

from engines.cost_tables import load_cost_table
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec
from policies.online import OnlineModels
from policies.types import Task

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class View:
    request_id: str
    step_index: int
    accept_lengths: list[int]
    batch_size: int
    context: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    spec_tokens: int
    accept_length: int


def measure(shared: bool, batch: int, steps: int, block: int, seed: int) -> dict[str, float]:
    spec = GoodputSpec()
    table = load_cost_table(ROOT / "cost_tables/qwen3-8b-h200.json")
    models = OnlineModels(spec, block, table)
    controller = StepController(
        lambda: GoodputPolicy(spec), models, block, rng=random.Random(seed), shared=shared
    )
    rng = random.Random(seed)
    tasks = list(Task)
    rows: list[tuple[str, Task, list[int]]] = [(f"r{i}", tasks[i % 3], []) for i in range(batch)]
    contexts: dict[str, dict[str, Any]] = {rid: {"task": t.value} for rid, t, _ in rows}
    decide_s = record_s = 0.0
    for step in range(steps):
        if step % 50 == 49:  # requests finish and new ones join
            i = rng.randrange(batch)
            rid = f"r{i}-{step}"
            rows[i] = (rid, rows[i][1], [])
            contexts[rid] = {"task": rows[i][1].value}
        views = [View(rid, len(h), list(h), batch, contexts[rid]) for rid, _, h in rows]
        started = time.process_time()
        ks = [controller(v) for v in views]
        decide_s += time.process_time() - started
        lengths = [min(k, rng.randint(0, 6)) + 1 for k in ks]
        started = time.process_time()
        for (_, task, _), k, n in zip(rows, ks, lengths, strict=True):
            controller.record(task, Report(k, n))
        models.record_step_time(batch, 16.0 if max(ks) > 7 else 8.0, 1.0, 0.01)
        record_s += time.process_time() - started
        for (_, _, history), n in zip(rows, lengths, strict=True):
            history.append(n)
    return {
        "decide_us_per_step": decide_s / steps * 1e6,
        "decide_us_per_row": decide_s / steps / batch * 1e6,
        "record_us_per_step": record_s / steps * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        for shared in (False, True):
            runs = [
                measure(shared, batch, args.steps, args.block_size, seed=batch)
                for _ in range(args.repeats)
            ]
            row: dict[str, Any] = {key: min(r[key] for r in runs) for key in runs[0]}
            row |= {"batch_size": batch, "mode": "per-batch" if shared else "per-request"}
            results.append(row)
    if args.json:
        print(json.dumps({"command": " ".join(sys.argv), "results": results}, indent=1))
        return 0
    print(f"{'B':>4} {'mode':<12} {'decide us/step':>15} {'us/row':>8} {'record us/step':>15}")
    for r in results:
        print(
            f"{r['batch_size']:>4} {r['mode']:<12} {r['decide_us_per_step']:>15.1f} "
            f"{r['decide_us_per_row']:>8.2f} {r['record_us_per_step']:>15.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
