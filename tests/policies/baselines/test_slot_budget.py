"""vLLM's budget rule and its padded collapse, on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from policies.baselines.slot_budget import (
    allocate_slots,
    draft_budget,
    expected_by_width,
    padded_width,
    ragged_costs,
    sorted_scores,
)

# Two rows; row 1 may verify 2 drafts only (its 0.1 slot is not eligible).
SURVIVAL = np.array([[0.9, 0.81, 0.2], [0.95, 0.3, 0.1]])
CAPS = np.array([3, 2])


@pytest.mark.parametrize(
    ("costs", "expected"),
    [
        # tokens 2, 2.9, 3.4, 3.5 -> rates 2, 2.42, 2.83, 2.33
        ([1.0, 1.2, 1.2, 1.5], 2),
        # every draft costs more than it brings: rates 2, 1.45, 1.13, 0.88
        ([1.0, 2.0, 3.0, 4.0], 0),
        # drafts are free: take every slot
        ([1.0, 1.0, 1.0, 1.0], 3),
    ],
)
def test_draft_budget_maximises_expected_tokens_per_second(
    costs: list[float], expected: int
) -> None:
    scores = np.array([0.9, 0.5, 0.1])
    assert draft_budget(scores, 2, np.array(costs)) == expected


def test_draft_budget_keeps_the_first_maximum_and_checks_its_costs() -> None:
    assert draft_budget(np.array([1.0]), 1, np.array([1.0, 2.0])) == 0  # rates 1 and 1
    with pytest.raises(ValueError, match="2 entries"):
        draft_budget(np.array([1.0]), 1, np.array([1.0]))


def test_sorted_scores_are_the_eligible_slots_best_first() -> None:
    assert sorted_scores(SURVIVAL, CAPS).tolist() == [0.95, 0.9, 0.81, 0.3, 0.2]


@pytest.mark.parametrize(
    ("survival", "caps", "budget", "expected"),
    [
        (SURVIVAL, CAPS, 3, [2, 1]),  # 0.95 (r1), 0.9 and 0.81 (r0)
        (SURVIVAL, CAPS, 1, [0, 1]),  # a later position of one row can outrank another
        (SURVIVAL, CAPS, 0, [0, 0]),
        (SURVIVAL, CAPS, 5, [3, 2]),
        (SURVIVAL, CAPS, 10, [3, 2]),  # never past a row's capacity
        (SURVIVAL, np.array([1, 2]), 3, [1, 2]),
        # ties go to the earlier row, as vLLM's (score, index) sort key does
        (np.array([[0.5, 0.25], [0.5, 0.25]]), np.array([2, 2]), 1, [1, 0]),
        (np.array([[0.5, 0.25], [0.5, 0.25]]), np.array([2, 2]), 3, [2, 1]),
    ],
)
def test_allocate_slots_admits_the_best_slots_as_prefixes(
    survival: np.ndarray, caps: np.ndarray, budget: int, expected: list[int]
) -> None:
    assert allocate_slots(survival, caps, budget).tolist() == expected


def test_expected_by_width_sums_eligible_survival_up_to_each_width() -> None:
    # per position: 0.9 + 0.95, 0.81 + 0.3, 0.2 (row 1's third slot is past its capacity)
    assert expected_by_width(SURVIVAL, CAPS) == pytest.approx([0.0, 1.85, 2.96, 3.16])


@pytest.mark.parametrize(
    ("cost_by_k", "candidates", "expected"),
    [
        # rates: k0 2/1, k1 3.85/1.1 = 3.5, k2 4.96/1.2 = 4.13, k3 5.16/1.6 = 3.23
        ([1.0, 1.1, 1.2, 1.6], [1, 2, 3], 2),
        ([1.0, 1.1, 1.2, 1.6], [3], 3),  # min k = 3: 3.23 still beats a plain step's 2
        ([1.0, 1.1, 1.2, 3.0], [3], 0),  # 5.16 / 3 = 1.72 < 2: no drafting
    ],
)
def test_padded_width_is_the_same_objective_over_one_width_per_step(
    cost_by_k: list[float], candidates: list[int], expected: int
) -> None:
    drafts = expected_by_width(SURVIVAL, CAPS)
    assert padded_width(drafts, 2, np.array(cost_by_k), candidates) == expected


def test_ragged_costs_price_d_drafts_as_ceil_d_over_b_per_row() -> None:
    assert ragged_costs(np.array([1.0, 2.0, 3.0]), 2, 4).tolist() == [1.0, 2.0, 2.0, 3.0, 3.0]
    assert ragged_costs(np.array([1.0, 2.0]), 1, 3).tolist() == [1.0, 2.0, 2.0, 2.0]


def _allocate_by_sort(survival: np.ndarray, capacities: np.ndarray, budget: int) -> np.ndarray:
    """The rule as vLLM states it: a stable sort of every eligible slot, best first."""
    rows, positions = survival.shape
    positions_ = np.arange(positions)[None, :] < capacities[:, None]
    scores = np.where(positions_, survival, -np.inf).ravel()
    winners = np.argsort(-scores, kind="stable")[: max(0, budget)]
    winners = winners[np.isfinite(scores[winners])]
    return np.bincount(winners // positions, minlength=rows).astype(np.int64)


def test_allocate_slots_selects_exactly_what_a_stable_sort_would() -> None:
    """The selection (partition + row-major ties) against the full sort, on random batches
    with many exact ties (scores from a few levels), zero and over-large budgets and rows
    that did not draft."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        rows, positions = int(rng.integers(1, 40)), int(rng.integers(1, 16))
        levels = rng.random(int(rng.integers(1, 6)))
        survival = np.cumprod(rng.choice(levels, size=(rows, positions)), axis=1)
        if rng.random() < 0.5:  # not a prefix product: the rule must not assume one
            survival = rng.choice(levels, size=(rows, positions))
        capacities = rng.integers(0, positions + 1, size=rows)
        for budget in (0, 1, int(rng.integers(0, rows * positions + 3)), rows * positions + 5):
            np.testing.assert_array_equal(
                allocate_slots(survival, capacities, budget),
                _allocate_by_sort(survival, capacities, budget),
            )
