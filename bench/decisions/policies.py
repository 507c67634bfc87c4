"""Every policy the harness compares, as what the embedded engine takes: a step planner (or
none) and the per-request controller of each job. Each run builds its policy afresh, so every
policy starts from the same priors.

- ``no-spec``, ``static-k<N>``: a fixed k, asked per request (no planner);
- ``dsd-schedule``: vLLM's ``num_speculative_tokens_per_batch_size``, made from the cost table
  and the trace's global acceptance (what ``draftctl policy export-schedule`` makes);
- ``vllm-av``: policies/baselines/vllm_av.py (docs/baselines.md);
- ``goodput``: draftctl's controller as the daemon runs it (engines/step_controller.py);
- ``oracle``: reads each row's drawn acceptance ahead (synthetic mode only; a per-step greedy
  choice, not a bound: docs/baselines.md).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.decisions.workload import Job
from engines.embedded.events import RequestView, SpecController, StepReport
from engines.embedded.synthetic import SyntheticAcceptance
from engines.step_controller import FixedPolicySource, StepController
from policies.baselines.base import StepPolicy
from policies.baselines.oracle import ClairvoyantOracle
from policies.baselines.schedule import BatchSizeSchedule
from policies.baselines.vllm_av import VllmAdaptiveVerification, VllmAvSettings
from policies.costmodel import CostTable
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec, PolicySpec
from policies.online import OnlineModels
from policies.types import StepCost, StepRow, Task, max_spec_tokens

STATIC_KS = (4, 7, 11, 15)
NAMES = ("no-spec", *(f"static-k{k}" for k in STATIC_KS), "dsd-schedule", "vllm-av", "goodput")


@dataclass
class Context:
    """What policies are built from, per arm."""

    block_size: int
    max_batch_size: int
    cost_table: CostTable
    goodput: GoodputSpec
    global_rates: Mapping[Task, Sequence[float]]  # conditional, per position
    global_mix: Mapping[Task, float]
    synthetic: SyntheticAcceptance | None
    seed: int

    def cost(self) -> StepCost:
        """The cost table as the goodput policy prices it before it learns anything."""
        snapshot = OnlineModels(self.goodput, self.block_size, self.cost_table).step_cost()
        assert snapshot is not None, "a cost table gives a step cost"
        return snapshot


@dataclass
class Built:
    """One policy, ready for a run."""

    planner: Any  # an engines.embedded.events.StepPlanner, or None
    controller_for: Callable[[Job], SpecController]
    host: Callable[[], tuple[float, int]]  # (seconds spent deciding, steps decided)


class BaselinePlanner:
    """A policies.baselines ``StepPolicy`` as the engine's step planner: one k for the step."""

    def __init__(self, policy: StepPolicy) -> None:
        self.policy = policy
        self._rows: dict[str, StepRow] = {}
        self.host_s = 0.0
        self.calls = 0

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        started = time.perf_counter()
        rows = [self._row(view) for view in views]
        k = self.policy.decide_step(rows, len(views)).spec_tokens
        self.host_s += time.perf_counter() - started
        self.calls += 1
        return [k] * len(views)

    def record(self, controllers: Sequence[SpecController], reports: Sequence[StepReport]) -> None:
        return None  # baselines learn from the rows' histories in decide_step

    def prepare(self, views: Sequence[RequestView], controllers: Sequence[SpecController]) -> None:
        return None  # nothing to prepare ahead: plan() decides on the step's own rows

    def _row(self, view: RequestView) -> StepRow:
        """A request's row, reused while its ceiling holds (its lists grow in place)."""
        row = self._rows.get(view.request_id)
        if row is None or row.max_spec_tokens != view.max_spec_tokens:
            if len(self._rows) > 4096:  # finished requests' rows: drop them all now and then
                self._rows.clear()
            row = self._rows[view.request_id] = StepRow(
                view.request_id,
                Task(view.context["task"]),
                view.accept_lengths,
                view.spec_tokens,
                view.max_spec_tokens,
            )
        return row


def build(name: str, ctx: Context) -> Built:
    """The named policy (see the module docstring)."""
    block_max = max_spec_tokens(ctx.block_size)
    if name == "no-spec" or name.startswith("static-k"):
        k = 0 if name == "no-spec" else min(int(name.removeprefix("static-k")), block_max)
        return Built(None, lambda job: lambda view: k, lambda: (0.0, 0))
    if name == "goodput":
        return _goodput(ctx)
    policy: StepPolicy
    if name == "dsd-schedule":
        policy = BatchSizeSchedule.from_acceptance(
            ctx.global_rates,
            ctx.global_mix,
            ctx.cost(),
            PolicySpec().min_spec_tokens,
            block_max,
            ctx.max_batch_size,
        )
    elif name == "vllm-av":
        av = VllmAdaptiveVerification(VllmAvSettings(max_spec_tokens=block_max), ctx.cost())
        av.prepare(ctx.max_batch_size)
        policy = av
    elif name == "oracle":
        planner: BaselinePlanner = OraclePlanner(ctx, block_max)
        return Built(planner, lambda job: lambda view: 0, lambda: (planner.host_s, planner.calls))
    else:
        raise ValueError(f"policy {name!r}: known are {', '.join((*NAMES, 'oracle'))}")
    planner = BaselinePlanner(policy)
    return Built(planner, lambda job: lambda view: 0, lambda: (planner.host_s, planner.calls))


def _goodput(ctx: Context) -> Built:
    models = OnlineModels(ctx.goodput, ctx.block_size, ctx.cost_table)
    spec = PolicySpec(kind="goodput", goodput=ctx.goodput)
    source = FixedPolicySource(spec, GoodputPolicy(ctx.goodput), models)
    controller = StepController(source, ctx.block_size, random.Random(ctx.seed))
    return Built(
        controller,
        lambda job: controller.start(job.task, 1.0, 0),
        lambda: (controller.host_s, controller.calls),
    )


class OraclePlanner(BaselinePlanner):
    """The oracle with the step's draws read for all rows in one vectorised call (a per-row
    draw costs ~10 us: 0.6 ms a step at batch 64, which would be charged to the oracle)."""

    def __init__(self, ctx: Context, block_max: int) -> None:
        synthetic = ctx.synthetic
        if synthetic is None:
            raise ValueError("the oracle reads drawn acceptance ahead: synthetic arms only")
        self._synthetic = synthetic
        self._runs: dict[str, int] = {}
        self._k_max = block_max
        oracle = ClairvoyantOracle(
            ctx.cost(), block_max, PolicySpec().min_spec_tokens, self._lookahead
        )
        super().__init__(oracle)

    def _lookahead(self, row: StepRow, k_max: int) -> int:
        return min(self._runs[str(row.row_id)], k_max)

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        started = time.perf_counter()
        runs = self._synthetic.accept_runs(
            [v.context["task"] for v in views],
            [v.context["synthetic_key"] for v in views],
            [v.step_index for v in views],
            self._k_max,
        )
        self._runs = {v.request_id: int(r) for v, r in zip(views, runs, strict=True)}
        self.host_s += time.perf_counter() - started
        return super().plan(views, controllers)
