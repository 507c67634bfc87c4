"""OnlineModels: the learned state the daemon holds for the goodput policy.

The daemon (gateway or embedded adapter) keeps one ``OnlineModels``, feeds it what backends
report, and copies ``observe(task)`` into each ``Observation``::

    table = goodput_cost_table(policy_spec.goodput, policy_dir)  # engines.cost_tables
    models = OnlineModels(policy_spec.goodput, block_size=16, cost_table=table)
    obs = Observation(task=..., concurrency=..., ..., **models.observe(task))
    decision = policy.decide(obs)
    ...
    models.record_outcome(task, spec_tokens=k, accept_lengths=outcome.accept_lengths,
                          step_times_s=outcome.step_times_s, batch_size=batch)

Updates are plain arithmetic (no I/O, no clock); the caller reads the cost table file
(``engines.cost_tables``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.acceptance import PositionCounts
from policies.costmodel import CostModel, CostTable, padded_width
from policies.model import GoodputSpec
from policies.types import TASKS, StepCost, Task


class OnlineModels:
    """Per-task acceptance estimates plus the step cost model, updated from outcomes."""

    def __init__(
        self,
        spec: GoodputSpec,
        block_size: int,
        cost_table: CostTable | None = None,
        verify_width_multiple: int | None = None,
    ):
        self.spec = spec
        self.block_size = block_size
        n = max(1, block_size - 1)
        self._acceptance = {
            task: PositionCounts(
                spec.prior_for(task, n),
                spec.prior_strength,
                spec.task_half_life_steps,
                spec.plain_step_age,
            )
            for task in TASKS
        }
        self.cost: CostModel | None = None
        if cost_table is not None:
            self.adopt_cost_table(cost_table, verify_width_multiple)

    def adopt_cost_table(self, table: CostTable, verify_width_multiple: int | None = None) -> bool:
        """Price steps with ``table`` unless a cost model exists already (the policy's own
        ``cost_table`` wins over an engine's start-up profile); True when adopted.
        ``verify_width_multiple``: the engine's own, when it knows it (1 for an engine whose
        rows verify at their own widths: every k has its own price); else the policy's."""
        if self.cost is not None:
            return False
        multiple = verify_width_multiple or self.spec.verify_width_multiple
        self.cost = CostModel(
            table=table,
            block_size=self.block_size,
            verify_width_multiple=multiple,
            draft_cost_fraction=self.spec.draft_cost_fraction,
            learning_rate=self.spec.cost_learning_rate,
            prior_overhead_s=self.spec.step_overhead_s,
            prior_overhead_per_request_s=self.spec.request_overhead_s,
        )
        return True

    def record_step(self, task: Task, spec_tokens: int, accept_length: int) -> None:
        """One verify step of one request (embedded engine, per step)."""
        self._acceptance[task].add_step(spec_tokens, accept_length)

    def record_steps(
        self, task: Task, spec_tokens: Sequence[int], accept_lengths: Sequence[int]
    ) -> None:
        """Many verify steps of ``task`` at once (the rows of one engine step)."""
        self._acceptance[task].add_steps(spec_tokens, accept_lengths)

    def record_step_time(
        self, batch_size: int, mean_verify_width: float, drafting_share: float, seconds: float
    ) -> None:
        """One measured engine step: refines T(B, k)."""
        if self.cost is not None:
            self.cost.observe_step(batch_size, mean_verify_width, drafting_share, seconds)

    def record_step_times(self, steps: Sequence[tuple[int, float, float, float]]) -> None:
        """Many measured engine steps, in order: (batch size, mean verify width, drafting
        share, seconds) each."""
        if self.cost is not None and steps:
            self.cost.observe_steps(steps)

    def record_outcome(
        self,
        task: Task,
        spec_tokens: int | Sequence[int],
        accept_lengths: Sequence[int] = (),
        accepted_per_position: Sequence[int] = (),
        num_drafts: int = 0,
        step_times_s: Sequence[float] = (),
        tpot_s: float | None = None,
        batch_size: int | None = None,
    ) -> None:
        """What a finished request reported (``engines.base.Outcome`` fields).

        ``spec_tokens`` is the k every step used (pools) or one k per step (embedded). Either
        per-step ``accept_lengths`` or aggregate ``accepted_per_position`` + ``num_drafts``
        (vLLM) update acceptance. Step times, or a pool's TPOT, refine the cost at
        ``batch_size`` when given.
        """
        per_step = _per_step_k(spec_tokens, len(accept_lengths))
        counts = self._acceptance[task]
        for k, length in zip(per_step, accept_lengths, strict=True):
            counts.add_step(k, length)
        if not accept_lengths and accepted_per_position:
            counts.add_position_counts(num_drafts, accepted_per_position)
        if batch_size is None or self.cost is None:
            return
        k0 = per_step[0] if per_step else (spec_tokens if isinstance(spec_tokens, int) else 0)
        width = float(padded_width(k0, self.cost.verify_width_multiple))
        drafting = 1.0 if k0 > 0 else 0.0
        for seconds in step_times_s:
            self.cost.observe_step(batch_size, width, drafting, seconds)
        if tpot_s is not None and not step_times_s:
            mean_length = sum(accept_lengths) / len(accept_lengths) if accept_lengths else 1.0
            self.cost.observe_step(batch_size, width, drafting, tpot_s * mean_length)

    def observe(self, task: Task) -> dict[str, Any]:
        """Observation fields for a decision about ``task``: rates, their trials, the cost."""
        snap = self._acceptance[task].snapshot()
        fields: dict[str, Any] = {"accept_rates": snap.rates, "accept_trials": snap.trials}
        fields["step_cost"] = self.step_cost()
        return fields

    def step_cost(self) -> StepCost | None:
        return self.cost.snapshot() if self.cost is not None else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready snapshot (for ``draftctl policy export-schedule --models``)."""
        out: dict[str, Any] = {"block_size": self.block_size, "tasks": {}}
        for task, counts in self._acceptance.items():
            snap = counts.snapshot()
            out["tasks"][task.value] = {"accept_rates": snap.rates, "trials": snap.trials}
        if self.cost is not None:
            out["cost_correction"] = list(self.cost.snapshot().corrections)
            out["cost_overhead_s"] = list(self.cost.snapshot().overheads_s)
            out["cost_width_fits"] = self.cost.width_fits()
        return out


def _per_step_k(spec_tokens: int | Sequence[int], num_steps: int) -> list[int]:
    if isinstance(spec_tokens, int):
        return [spec_tokens] * num_steps
    if len(spec_tokens) != num_steps:
        raise ValueError(
            f"spec_tokens has {len(spec_tokens)} entries but accept_lengths has {num_steps}; "
            "pass one k per step or a single k"
        )
    return list(spec_tokens)
