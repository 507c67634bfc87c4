"""The acceptance priors of an uncertain request: the mixture of the tasks' priors."""

import math
from typing import Any

import pytest

from policies.task_mixture import mixed_observation_fields, mixed_rates, mixed_trials
from policies.types import Task

MATH_RATES = (0.9, 0.9, 0.9, 0.9)
CHAT_RATES = (0.5, 0.4, 0.3, 0.2)


def survival(rates: tuple[float, ...]) -> list[float]:
    return [math.prod(rates[: i + 1]) for i in range(len(rates))]


def test_mixture_of_survivals_not_of_rates() -> None:
    scores = {Task.MATH: 0.6, Task.CHAT: 0.4}
    mixed = mixed_rates({Task.MATH: MATH_RATES, Task.CHAT: CHAT_RATES}, scores)
    pairs = zip(survival(MATH_RATES), survival(CHAT_RATES), strict=True)
    expected = [0.6 * m + 0.4 * c for m, c in pairs]
    assert survival(mixed) == pytest.approx(expected)
    # the naive mixture of conditional rates over-states later positions
    assert mixed[3] > 0.6 * 0.9 + 0.4 * 0.2
    assert mixed[3] < 0.9


def test_a_certain_task_gives_its_own_rates() -> None:
    mixed = mixed_rates({Task.MATH: MATH_RATES, Task.CHAT: CHAT_RATES}, {Task.MATH: 1.0})
    assert mixed == pytest.approx(MATH_RATES)


def test_shorter_rate_lists_count_as_rejections_and_zero_survival_stays_zero() -> None:
    mixed = mixed_rates({Task.MATH: (0.5,), Task.CODE: (0.0, 0.9)}, {Task.MATH: 1, Task.CODE: 1})
    assert mixed == pytest.approx((0.25, 0.0))
    assert mixed_rates({Task.MATH: (0.0, 0.5)}, {Task.MATH: 1.0}) == (0.0, 0.0)


def test_no_weight_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="give no weight"):
        mixed_rates({Task.MATH: MATH_RATES}, {Task.CHAT: 1.0})


def test_trials_are_weighted() -> None:
    trials = mixed_trials(
        {Task.MATH: (10.0, 8.0), Task.CHAT: (30.0,)}, {Task.MATH: 0.5, Task.CHAT: 0.5}
    )
    assert trials == pytest.approx((20.0, 4.0))


def test_fields_keep_the_top_tasks_other_fields_and_skip_zero_weights() -> None:
    cost = object()
    fields: dict[Task, dict[str, Any]] = {
        Task.MATH: {"accept_rates": MATH_RATES, "accept_trials": (5.0,) * 4, "step_cost": cost},
        Task.CHAT: {"accept_rates": CHAT_RATES, "accept_trials": (5.0,) * 4, "step_cost": None},
        Task.CODE: {"accept_rates": (1.0,) * 4, "accept_trials": (5.0,) * 4, "step_cost": None},
    }
    scores = {Task.MATH: 0.7, Task.CHAT: 0.3, Task.CODE: 0.0}
    mixed = mixed_observation_fields(fields, scores, Task.MATH)
    assert mixed["step_cost"] is cost
    assert mixed["accept_rates"] == pytest.approx(
        mixed_rates({Task.MATH: MATH_RATES, Task.CHAT: CHAT_RATES}, scores)
    )
    alone = mixed_observation_fields(fields, {Task.CHAT: 1.0}, Task.CHAT)
    assert alone == fields[Task.CHAT]
