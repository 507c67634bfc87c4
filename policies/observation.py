"""The Observation of a per-step decision (embedded engine, simulator): built in one place.

Per-request decisions at the gateway gather live load and pool views first
(controller/observe.py) and build theirs there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.types import Observation, Task


def step_observation(
    *,
    task: Task,
    confidence: float,
    batch_size: int,
    bounds: tuple[int, int],
    block_size: int,
    learned: Mapping[str, Any],
    accept_lengths: Sequence[int],
    spec_tokens: Sequence[int],
    step_index: int,
    now_s: float,
    rng_u: float,
) -> Observation:
    """What a policy sees before one step of one request.

    ``bounds``: the policy's [min, max] k for this block; ``learned``: ``accept_rates``,
    ``accept_trials`` and optionally ``step_cost`` (online models or windowed statistics);
    ``accept_lengths`` / ``spec_tokens``: the request's recent steps, aligned (the k each step
    ran with), so that a policy can tell a rejection from a position never drafted.
    """
    return Observation(
        task=task,
        confidence=confidence,
        concurrency=batch_size,
        min_spec_tokens=bounds[0],
        max_spec_tokens=bounds[1],
        block_size=block_size,
        accept_rates=tuple(learned.get("accept_rates", ())),
        accept_trials=tuple(learned.get("accept_trials", ())),
        step_cost=learned.get("step_cost"),
        request_accept_lengths=tuple(accept_lengths),
        request_spec_tokens=tuple(spec_tokens),
        previous_spec_tokens=spec_tokens[-1] if spec_tokens else None,
        step_index=step_index,
        now_s=now_s,
        rng_u=rng_u,
    )
