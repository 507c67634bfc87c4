"""Acceptance priors of a request whose task is uncertain: the mixture of the tasks' priors.

The classifier gives a probability per task. Drafting for "chat" when the request is 60%
likely maths throws away long accepted runs; drafting for "maths" when it is chat wastes
verify width. The honest prior is the mixture: the accept length of the request is the
task's accept length with the task's probability, so its *survival* (the probability that
positions 1..i are all accepted) is the probability-weighted sum of the tasks' survivals:

    S_t(i) = prod_{j <= i} r_t(j)                  r_t: task t's conditional accept rates
    S(i)   = sum_t p_t * S_t(i)
    r(i)   = S(i) / S(i - 1)                        (S(0) = 1; r(i) = 0 once S(i - 1) = 0)

(Mixing the conditional rates directly would be wrong: a position after a rejection-prone
one would keep the optimistic task's rate.) The trials behind each position are mixed with
the same weights. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.types import Task

# Above this top probability the request is treated as certain (one task's priors, no mixing).
CERTAIN_PROBABILITY = 0.99


def mixed_rates(
    rates_by_task: Mapping[Task, Sequence[float]], scores: Mapping[Task, float]
) -> tuple[float, ...]:
    """The conditional accept rates of the mixture (module docstring); positions that some
    task lacks count as rejected for it (survival 0 from there)."""
    total = sum(scores.get(task, 0.0) for task in rates_by_task)
    if total <= 0.0:
        raise ValueError(f"task scores {dict(scores)} give no weight to {list(rates_by_task)}")
    length = max((len(rates) for rates in rates_by_task.values()), default=0)
    survivals = [0.0] * length
    for task, rates in rates_by_task.items():
        weight = scores.get(task, 0.0) / total
        survival = 1.0
        for position in range(length):
            survival *= rates[position] if position < len(rates) else 0.0
            survivals[position] += weight * survival
    mixed = []
    previous = 1.0
    for survival in survivals:
        mixed.append(survival / previous if previous > 0.0 else 0.0)
        previous = survival
    return tuple(mixed)


def mixed_trials(
    trials_by_task: Mapping[Task, Sequence[float]], scores: Mapping[Task, float]
) -> tuple[float, ...]:
    """Per position, the probability-weighted trials of the tasks (0 where a task has none)."""
    total = sum(scores.get(task, 0.0) for task in trials_by_task) or 1.0
    length = max((len(trials) for trials in trials_by_task.values()), default=0)
    return tuple(
        sum(
            scores.get(task, 0.0) / total * (trials[position] if position < len(trials) else 0.0)
            for task, trials in trials_by_task.items()
        )
        for position in range(length)
    )


def mixed_observation_fields(
    fields_by_task: Mapping[Task, Mapping[str, Any]], scores: Mapping[Task, float], top: Task
) -> dict[str, Any]:
    """Observation fields (``accept_rates``, ``accept_trials`` and whatever else the top
    task's fields carry, e.g. ``step_cost``) for a request with task ``scores``.

    Tasks with no weight are left out; with one task left, its fields are returned as they are.
    """
    weighted = {
        task: fields for task, fields in fields_by_task.items() if scores.get(task, 0.0) > 0.0
    }
    if len(weighted) <= 1:
        return dict(fields_by_task[top])
    mixed = dict(fields_by_task[top])
    mixed["accept_rates"] = mixed_rates(
        {task: fields.get("accept_rates", ()) for task, fields in weighted.items()}, scores
    )
    mixed["accept_trials"] = mixed_trials(
        {task: fields.get("accept_trials", ()) for task, fields in weighted.items()}, scores
    )
    return mixed
