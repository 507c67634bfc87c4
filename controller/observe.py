"""Build the Observation a policy decides on: the one place that gathers live inputs.

Concurrency is where the request will run: for a fleet of pools, the sum over its pools of
the larger of draftctl's own in-flight count and the scraped running + waiting count (other
clients may use the servers too), plus this request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.policy.running import RunningPolicy
from controller.stats import LiveStats, TaskEstimates
from engines.base import Backend
from policies.task_mixture import CERTAIN_PROBABILITY, mixed_observation_fields
from policies.types import Observation, PoolView, Task


def pool_load(backend: Backend, stats: LiveStats) -> int:
    scraped = stats.scraped.get(backend.name)
    own = backend.num_inflight()
    if scraped is None or scraped.running is None:
        return own
    return max(own, scraped.running + (scraped.waiting or 0))


def pool_view(backend: Backend, estimates: TaskEstimates | None = None) -> PoolView:
    """What policies and routing know about ``backend`` (the one place a PoolView is built)."""
    return PoolView(
        name=backend.name,
        spec_tokens=backend.max_spec_tokens,
        block_size=backend.block_size,
        num_inflight=backend.num_inflight(),
        num_servers=backend.num_servers(),
        is_healthy=backend.is_healthy(),
        is_adjustable=backend.is_adjustable,
        tpot_s=None if estimates is None else estimates.pool_tpot_s.get(backend.name),
        accept_length=None if estimates is None else estimates.pool_accept_length.get(backend.name),
    )


def _learned(task: Task, running: RunningPolicy, stats: LiveStats, now_s: float) -> dict[str, Any]:
    """A task's acceptance fields: the online models', else the windowed stats'."""
    learned = running.observe(task)
    if learned is not None:
        return learned
    estimates = stats.estimates(task, now_s)
    return {"accept_rates": estimates.accept_rates, "accept_trials": estimates.accept_trials}


def build_observation(
    task: Task,
    confidence: float,
    fleet: Sequence[Backend],
    running: RunningPolicy,
    stats: LiveStats,
    now_s: float,
    rng_u: float,
    scores: Mapping[Task, float] | None = None,
) -> Observation:
    """Everything the policy may know for one request bound to ``fleet`` (one model).

    Acceptance comes from the running policy's online models when it has them (goodput:
    censoring-aware, with the step cost model), else from the windowed stats. With the
    classifier's ``scores`` and no task above ``CERTAIN_PROBABILITY``, it is the mixture of
    every task's acceptance, weighted by its probability (``policies.task_mixture``).
    """
    block_size = max(b.block_size for b in fleet)
    estimates = stats.estimates(task, now_s)
    min_k, max_k = running.spec.bounds_for(block_size)
    learned = _learned(task, running, stats, now_s)
    if scores is not None and max(scores.values(), default=1.0) < CERTAIN_PROBABILITY:
        fields = {other: _learned(other, running, stats, now_s) for other in scores}
        fields[task] = learned
        learned = mixed_observation_fields(fields, scores, task)
    return Observation(
        task=task,
        confidence=confidence,
        concurrency=sum(pool_load(b, stats) for b in fleet) + 1,
        min_spec_tokens=min_k,
        max_spec_tokens=max_k,
        block_size=block_size,
        pools=tuple(pool_view(b, estimates) for b in fleet),
        now_s=now_s,
        rng_u=rng_u,
        **learned,
    )
