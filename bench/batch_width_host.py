"""Host time of the batch planner per engine step: ``BatchWidth.decide`` at batch 1, 8, 64.

The embedded engine decides k on its own thread before every step, inside the step's wall
clock. This replays synthetic steps (rows of mixed tasks, accept lengths drawn from per-task
rates, requests that end and are replaced, the engine's clamp near a request's end, step
times from the measured Qwen3-8B H200 table with a 7% premium on width 16 and 3% noise,
block 16) and times, per engine step, building the step's ``StepRow`` list and
``BatchWidth.decide``, which reads ``OnlineModels.observe`` once per task (rates, trials and
the cost snapshot, rebuilt when the online fits moved). Feeding the step back into the online
models runs between steps, untimed (on the engine it runs on the event loop).

``--before REV`` also times the planner and cost model of git revision REV on the same steps:
``before``, the planner asked row by row through its ``spec_tokens`` (the API before
``decide``), and ``before_engine_path``, the same as the engine asked it, through a view and
that revision's ``StepController`` per row (what the H200 runs reported as controller time).
Thread CPU time (``thread_time``: time other processes take on the machine does not count),
interleaved (one run of every planner and batch size, then the next repeat); per batch size
the median and the best of ``--repeats`` runs of ``--steps`` steps. Prints one JSON object:

    .venv/bin/python bench/batch_width_host.py --before ae56d8a \\
        > bench/results/batch_width_host.json

``--variant NAME:KEY=VALUE,...`` also times today's planner with those goodput settings (e.g.
``nocal:shared_calibration=false``: what the calibration costs a step).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engines.cost_tables import load_cost_table  # noqa: E402
from policies.batch_width import BatchWidth, StepRow  # noqa: E402
from policies.costmodel import CostModel, padded_width  # noqa: E402
from policies.model import GoodputSpec  # noqa: E402
from policies.online import OnlineModels  # noqa: E402
from policies.types import TASKS, Task  # noqa: E402

BLOCK = 16
TABLE = load_cost_table(ROOT / "cost_tables/qwen3-8b-h200.json")
# Conditional acceptance per task (DFlash-like: ~6.9 / 5.6 / 4.0 tokens per step at k = 15).
RATES = {Task.MATH: 0.9, Task.CODE: 0.86, Task.CHAT: 0.76}


@dataclass
class Request:
    row_id: int
    task: Task
    remaining: int
    accept_lengths: list[int] = field(default_factory=list)
    spec_tokens: list[int] = field(default_factory=list)
    row: StepRow | None = None  # built once, again only when its ceiling changes

    def step_row(self) -> StepRow:
        ceiling = min(BLOCK, self.remaining) - 1
        if self.row is None or self.row.max_spec_tokens != ceiling:
            self.row = StepRow(
                self.row_id, self.task, self.accept_lengths, self.spec_tokens, ceiling
            )
        return self.row


class Workload:
    """Closed-loop rows: a finished request is replaced by a new one in the next step."""

    def __init__(self, batch: int, seed: int):
        self._rng = random.Random(seed)
        self._next_id = 0
        self._truth = CostModel(TABLE, block_size=BLOCK).snapshot()
        self.rows = [self._new() for _ in range(batch)]

    def _new(self) -> Request:
        self._next_id += 1
        task = TASKS[self._next_id % len(TASKS)]
        return Request(self._next_id, task, self._rng.randint(128, 512))

    def advance(self, k: int, models: OnlineModels) -> None:
        """Run one step at k (clamped per row), record it, replace finished rows."""
        for i, row in enumerate(self.rows):
            ran = min(k, BLOCK - 1, row.remaining - 1)
            accepted = 0
            while accepted < ran and self._rng.random() < RATES[row.task]:
                accepted += 1
            length = min(accepted + 1, row.remaining)
            row.accept_lengths.append(length)
            row.spec_tokens.append(ran)
            row.remaining -= length
            models.record_step(row.task, ran, length)
            if row.remaining <= 0:
                self.rows[i] = self._new()
        batch = len(self.rows)
        seconds = self._truth.step_time_s(batch, k) * (1.07 if k > 7 else 1.0)
        seconds *= 1.0 + 0.03 * self._rng.gauss(0.0, 1.0)
        models.record_step_time(batch, float(padded_width(k, 8)), float(k > 0), seconds)


Decide = Callable[[list[Request]], int]
# A planner: given the spec, its random source and the online models (whose cost model it
# may replace), the per-step decision.
Planner = Callable[[GoodputSpec, random.Random, OnlineModels], Decide]


def planner_now(spec: GoodputSpec, rng: random.Random, models: OnlineModels) -> Decide:
    """One ``decide`` per step; the engine then clamps the k of each row to its ceiling."""
    width = BatchWidth(spec, BLOCK, 4, rng_u=rng.random)

    def decide(rows: list[Request]) -> int:
        k = width.decide([r.step_row() for r in rows], models.observe)
        ks = [min(k, r.remaining - 1) for r in rows]
        return max(ks)

    return decide


class OldSpec:
    """Settings as revisions before ``probe_min_steps`` read them (``probe_min_trials`` 200)."""

    def __init__(self, spec: GoodputSpec):
        self._spec = spec
        self.probe_min_trials = 200.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spec, name)


def planner_at(revision: str) -> Planner:
    """The planner and cost model of ``revision``, loaded from git, asked row by row."""
    width_module = _module_at(revision, "policies/batch_width.py")
    cost_module = _module_at(revision, "policies/costmodel.py")

    def make(spec: GoodputSpec, rng: random.Random, models: OnlineModels) -> Decide:
        models.cost = cost_module.CostModel(
            table=TABLE,
            block_size=BLOCK,
            verify_width_multiple=spec.verify_width_multiple,
            draft_cost_fraction=spec.draft_cost_fraction,
            learning_rate=spec.cost_learning_rate,
        )
        width = width_module.BatchWidth(OldSpec(spec), BLOCK, 4, rng_u=rng.random)

        def decide(rows: list[Request]) -> int:
            size, observe = len(rows), models.observe
            ks = [
                width.spec_tokens(r.row_id, r.task, size, r.accept_lengths, observe) for r in rows
            ]
            return max(min(k, r.remaining - 1) for k, r in zip(ks, rows, strict=True))

        return decide

    return make


@dataclass(frozen=True)
class View:
    """What the engine built per row per step for a per-row controller (``RequestView``)."""

    request_id: int
    step_index: int
    accept_lengths: list[int]
    batch_size: int
    num_generated: int
    context: dict[str, Any]


def engine_path_at(revision: str) -> Planner:
    """As the engine asked ``revision``'s planner: a view and a ``StepController`` call per row
    (what the H200 runs timed as the controller's host time per step)."""
    planner = planner_at(revision)
    controller_module = _module_at(revision, "policies/step_controller.py")

    def make(spec: GoodputSpec, rng: random.Random, models: OnlineModels) -> Decide:
        planner(spec, rng, models)  # installs that revision's cost model
        old_width = _module_at(revision, "policies/batch_width.py").BatchWidth
        setattr(controller_module, "BatchWidth", old_width)  # noqa: B010  # not the current one
        models.spec = OldSpec(spec)  # type: ignore[assignment]  # the controller reads it
        controller = controller_module.StepController(
            lambda: None, models, BLOCK, rng=rng, shared=True
        )
        contexts: dict[int, dict[str, Any]] = {}

        def decide(rows: list[Request]) -> int:
            widest = 0
            for r in rows:
                context = contexts.setdefault(r.row_id, {"task": r.task.value})
                steps = len(r.accept_lengths)
                view = View(r.row_id, steps, r.accept_lengths, len(rows), steps, context)
                k = max(0, min(int(controller(view)), BLOCK - 1, r.remaining - 1))
                widest = max(widest, k)
            return widest

        return decide

    return make


def _module_at(revision: str, path: str) -> types.ModuleType:
    source = subprocess.run(
        ["git", "show", f"{revision}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType(f"{Path(path).stem}_at_{revision}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"{revision}:{path}", "exec"), module.__dict__)
    return module


def run(planner: Planner, batch: int, steps: int, spec: GoodputSpec | None = None) -> float:
    """Microseconds of host time per engine step (the policy's defaults unless ``spec``)."""
    spec = spec or GoodputSpec()
    models = OnlineModels(spec, BLOCK, TABLE)
    decide = planner(spec, random.Random(1), models)
    workload = Workload(batch, seed=batch)
    spent = 0.0
    for step in range(steps + 50):  # 50 warm-up steps, untimed
        started = time.thread_time()
        k = decide(workload.rows)
        if step >= 50:
            spent += time.thread_time() - started
        workload.advance(k, models)
    return spent / steps * 1e6


def measure(planners: dict[str, tuple[Planner, GoodputSpec | None]], args: Any) -> dict[str, Any]:
    runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for name, (planner, spec) in planners.items():
            for batch in args.batch_sizes:
                runs.setdefault((name, batch), []).append(run(planner, batch, args.steps, spec))
    out: dict[str, Any] = {name: {} for name in planners}
    for (name, batch), times in runs.items():
        out[name][str(batch)] = {
            "us_per_step_median": round(statistics.median(times), 1),
            "us_per_step_best": round(min(times), 1),
            "us_per_row_best": round(min(times) / batch, 2),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--before",
        metavar="REV",
        help="also time the planner of this revision (one that still has "
        "policies/step_controller.py and the row-by-row API: before session 33's move)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="also time today's planner with these goodput settings (repeatable), e.g. "
        "nocal:shared_calibration=false",
    )
    args = parser.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    variants: dict[str, GoodputSpec] = {}
    for text in args.variant:
        name, _, settings = text.partition(":")
        pairs = [item.partition("=") for item in settings.split(",") if item]
        if not name or not pairs or any(not key or not sep for key, sep, _ in pairs):
            parser.error(f"--variant {text!r}: expected NAME:KEY=VALUE,...")
        try:
            variants[name] = GoodputSpec(**{key: value for key, _, value in pairs})
        except ValueError as error:
            parser.error(f"--variant {text!r}: {error}")
    if args.before:
        found = subprocess.run(
            ["git", "cat-file", "-e", f"{args.before}:policies/step_controller.py"],
            cwd=ROOT,
            capture_output=True,
        )
        if found.returncode:
            parser.error(
                f"--before {args.before}: that revision has no policies/step_controller.py "
                "(the row-by-row planner this compares against moved to engines/ later)"
            )
    result: dict[str, Any] = {
        "command": "python bench/batch_width_host.py " + " ".join(argv or sys.argv[1:]),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "steps": args.steps,
        "repeats": args.repeats,
        "clock": "thread CPU time",
    }
    planners: dict[str, tuple[Planner, GoodputSpec | None]] = {"after": (planner_now, None)}
    for name, spec in variants.items():
        planners[name] = (planner_now, spec)
        result.setdefault("variants", {})[name] = spec.model_dump(exclude_defaults=True)
    if args.before:
        planners["before"] = (planner_at(args.before), None)
        planners["before_engine_path"] = (engine_path_at(args.before), None)
        result["before_revision"] = args.before
    result.update(measure(planners, args))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
