"""best_shared_k: one k for a padded batch, from every row's own rates."""

from __future__ import annotations

from policies.costmodel import CostModel, CostTable
from policies.schedule import best_shared_k

# Shaped like the measured Qwen3-8B H200 table: width 8 costs ~1.16x at batch 1, ~1.9x at 64.
TABLE = CostTable(
    batch_sizes=(1, 8, 64),
    tokens_per_request=(1, 8, 16),
    step_time_s=((7.5e-3, 8.7e-3, 8.7e-3), (8.4e-3, 9.0e-3, 9.7e-3), (11.5e-3, 22e-3, 37.8e-3)),
)
COST = CostModel(TABLE, block_size=8, verify_width_multiple=8, draft_cost_fraction=0.16)
SNAP = COST.snapshot()


def test_batch_one_drafts_the_widest_k_that_costs_the_same() -> None:
    assert best_shared_k([[0.6] * 7], SNAP, 4, 7) == 7


def test_a_busy_batch_drafts_only_when_its_rows_together_pay_for_it() -> None:
    easy, hard = [0.8] * 7, [0.2] * 7
    # 64 hard rows: a shared width-8 step (~2.2x a plain one) cannot pay off.
    assert best_shared_k([hard] * 64, SNAP, 4, 7) == 0
    # 64 easy rows: ~4.2 tokens per row per step, drafting wins.
    assert best_shared_k([easy] * 64, SNAP, 4, 7) == 7
    # Mixed: the easy rows carry the hard ones only when there are enough of them.
    assert best_shared_k([easy] * 48 + [hard] * 16, SNAP, 4, 7) == 7
    assert best_shared_k([easy] * 8 + [hard] * 56, SNAP, 4, 7) == 0


def test_min_gain_and_empty_batches() -> None:
    marginal = [[0.62] * 7] * 64  # E(7) ~ 2.57 against a ~2.22x step: a ~16% gain
    assert best_shared_k(marginal, SNAP, 4, 7, min_gain=0.05) == 7
    assert best_shared_k(marginal, SNAP, 4, 7, min_gain=0.5) == 0
    assert best_shared_k([], SNAP, 4, 7) == 0
