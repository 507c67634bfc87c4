"""The clairvoyant per-step oracle on hand-made cases, and the roofline bound."""

from __future__ import annotations

import pytest

from policies.baselines.oracle import ClairvoyantOracle, roofline_tok_s
from policies.types import StepRow, Task


class WidthCost:
    """T(B, k) = (1 + 0.1 (B - 1)) x (1 plain, 1.2 up to width 8, 1.4 up to width 16)."""

    def step_time_s(self, batch_size: int, spec_tokens: int) -> float:
        width = 1.0 if spec_tokens == 0 else (1.2 if spec_tokens <= 7 else 1.4)
        return (1.0 + 0.1 * (batch_size - 1)) * width


def _rows(ceilings: list[int]) -> list[StepRow]:
    return [StepRow(f"r{i}", Task.MATH, (), (), c) for i, c in enumerate(ceilings)]


@pytest.mark.parametrize(
    ("runs", "ceilings", "min_k", "expected"),
    [
        # k=3: 8/1.2 = 6.7, k=7: 12/1.2 = 10, k=10: 15/1.4 = 10.7 (k 11-15: same tokens, same cost)
        ([3, 10], [15, 15], 1, 10),
        # row 2 can verify 5 at most: k=5 gives 10/1.2 = 8.3, nothing wider adds a token
        ([3, 10], [15, 5], 1, 5),
        # nothing would be accepted: a plain step
        ([0, 0], [15, 15], 1, 0),
        # k must be >= 4: 8/1.2 = 6.7 still beats a plain step's 2
        ([3, 3], [15, 15], 4, 4),
    ],
)
def test_the_oracle_verifies_the_k_with_the_most_tokens_per_second(
    runs: list[int], ceilings: list[int], min_k: int, expected: int
) -> None:
    rows = _rows(ceilings)
    ahead = {row.row_id: run for row, run in zip(rows, runs, strict=True)}
    asked: list[int] = []

    def lookahead(row: StepRow, max_k: int) -> int:
        asked.append(max_k)
        return ahead[row.row_id]

    oracle = ClairvoyantOracle(WidthCost(), 15, min_k, lookahead)
    assert oracle.decide_step(rows, len(rows)).spec_tokens == expected
    assert asked == [15, 15]  # the draw at the full block, clamped per row afterwards


def test_the_roofline_is_the_best_all_accepted_step_and_bounds_the_oracle() -> None:
    cost = WidthCost()
    # batch 2 at k = 15, every draft accepted: 32 tokens / (1.1 x 1.4)
    assert roofline_tok_s(cost, 2, 15) == pytest.approx(32 / 1.54)
    rows = _rows([15, 15])
    oracle = ClairvoyantOracle(cost, 15, 1, lambda row, k: 15)
    k = oracle.decide_step(rows, 2).spec_tokens
    assert 2 * (k + 1) / cost.step_time_s(2, k) <= roofline_tok_s(cost, 2, 15)
    with pytest.raises(ValueError, match="max_batch_size"):
        roofline_tok_s(cost, 0, 15)


def test_an_empty_batch_drafts_nothing() -> None:
    oracle = ClairvoyantOracle(WidthCost(), 15, 1, lambda row, k: 0)
    assert oracle.decide_step([], 0).spec_tokens == 0
