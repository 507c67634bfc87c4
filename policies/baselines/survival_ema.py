"""Batch-wide EMA of accepted-prefix survival per draft position (vLLM's DFlash adaptive K).

From vllm-project/vllm#52559 (``DFlashAdaptiveKPolicy.record_outcomes`` in
``vllm/v1/worker/gpu/spec_decode/dflash/adaptive_k.py``; open, not merged): after each step,
for every position j (0-based) the rows that drafted more than j are eligible and

    observed_j = mean over eligible rows of [accepted > j]
    survival_j = (1 - w) survival_j + w observed_j        (w = ``history_weight``, 0.2)

then survival is made non-increasing (``np.minimum.accumulate``). Survival starts at 1 and a
position no row drafted keeps its value. ``survival_j`` is the probability that position j + 1
is accepted (not conditional on j being accepted). One estimate for the whole batch: it knows
nothing about any one request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from policies.baselines.slot_budget import Floats


class SurvivalEma:
    def __init__(self, num_positions: int, history_weight: float = 0.2):
        if num_positions < 1:
            raise ValueError(f"num_positions must be >= 1, got {num_positions}")
        if not 0.0 < history_weight <= 1.0:
            raise ValueError(f"history_weight must be in (0, 1], got {history_weight}")
        self.history_weight = history_weight
        self._survival = np.ones(num_positions, dtype=np.float64)

    @property
    def survival(self) -> Floats:
        """[K] current survival per position (a copy)."""
        return self._survival.copy()

    def record_step(self, spec_tokens: Sequence[int], accepted: Sequence[int]) -> None:
        """One engine step: the k each row ran and the drafts each row accepted."""
        if not spec_tokens:
            return
        drafted = np.asarray(spec_tokens, dtype=np.int64)
        hits = np.asarray(accepted, dtype=np.int64)
        positions = np.arange(len(self._survival))
        eligible = drafted[:, None] > positions[None, :]  # [rows, K]
        counts = eligible.sum(axis=0)
        reached = (eligible & (hits[:, None] > positions[None, :])).sum(axis=0)
        seen = counts > 0
        observed = reached[seen] / counts[seen]
        w = self.history_weight
        self._survival[seen] = (1.0 - w) * self._survival[seen] + w * observed
        np.minimum.accumulate(self._survival, out=self._survival)
