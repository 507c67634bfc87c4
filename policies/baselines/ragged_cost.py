"""What vLLM's budget prices: a step with d draft tokens on top of the batch's own tokens.

vLLM profiles its verify cost per total token count (CUDA graphs captured at fine-grained
token counts), so d extra draft tokens cost what B + d tokens cost, however they are spread
over the rows. ``TableRaggedCost`` gives that from our profiled table: B rows of
1 + d / B tokens each, unpadded (bilinear in the table), plus the draft forward when d > 0,
with the cost model's fitted factor and host overhead at B (as ``CostSnapshot`` applies them to
padded steps). Fixed once built, as vLLM's profile is.

Where the table holds whole steps measured at the engine's captured token counts
(``CostTable.token_buckets``, the embedded engine's start-up profile on a GPU), a step of B
rows and N = B + d tokens is priced at the captured count it runs, N' (the smallest measured
one >= N at the batch bucket B' >= B its graph pads to): the table's B-row step of N' tokens,
times the measured over the table's time at (B', N'). The table's line between two widths
hides the stairs a GPU's tiled matrix products climb (H200, 8B, 64 rows: 1.8 ms from 384 to
416 tokens, hardly more to 448), so a budget priced on it stops just past a stair, where a
step pays a whole tile for a few drafts; priced per count it stops at a stair's edge unless
the drafts past it pay for the tile.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from policies.costmodel import CostModel


class RaggedCost(Protocol):
    """Seconds for a step of ``batch_size`` rows verifying ``num_draft_tokens`` drafts in all."""

    def step_time_s(self, batch_size: int, num_draft_tokens: int) -> float: ...


class BudgetCosts:
    """cost(d) for d = 0..max_drafts at one batch size, memoised per batch size (the budget
    rule's price list; at least every draft a full batch of ``positions`` could verify)."""

    def __init__(self, cost: RaggedCost, positions: int):
        self._cost = cost
        self._positions = positions
        self._by_batch: dict[int, np.ndarray] = {}

    def __call__(self, batch_size: int, max_drafts: int) -> np.ndarray:
        """A read-only view (no copy: the budget rule runs between draft and verify)."""
        costs = self._by_batch.get(batch_size)
        if costs is None or len(costs) <= max_drafts:
            top = max(max_drafts, batch_size * self._positions)
            costs = np.array([self._cost.step_time_s(batch_size, d) for d in range(top + 1)])
            costs.setflags(write=False)
            self._by_batch[batch_size] = costs
        return costs[: max_drafts + 1]


class TableRaggedCost:
    def __init__(self, model: CostModel):
        self._model = model
        self._snapshot = model.snapshot()

    def step_time_s(self, batch_size: int, num_draft_tokens: int) -> float:
        batch = max(1, batch_size)
        tokens = float(batch + num_draft_tokens)
        drafting = 1.0 if num_draft_tokens > 0 else 0.0
        ratio = 1.0
        if drafting:  # the captured count it runs (``CostModel.token_bucket``)
            tokens, ratio = self._model.token_bucket(batch, batch + num_draft_tokens)
        base = self._model.base_step_time_s(batch, tokens / batch, drafting)
        return base * ratio * self._snapshot.correction(batch) + self._snapshot.overhead_s(batch)
