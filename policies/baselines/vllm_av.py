"""vLLM's adaptive verification (Model Runner V2) on a padded batch: one k per step.

Per step, as vLLM does it (sources and what differs: docs/baselines.md):

1. learn: each row's outcome of the previous step (the k it ran, the drafts it accepted)
   updates the acceptance EMA (``survival_ema``) and, for rows that were scored from draft
   confidence, the logistic estimator (``logistic_acceptance``, refit every 100 steps);
2. score: every (row, position) slot gets its survival probability: the running product of
   the logistic's per-position acceptance when the row carries draft confidence, else the
   batch-wide EMA survival (vLLM's DFlash estimator without draft logits);
3. budget: vLLM's rule (``slot_budget.draft_budget``) over every eligible slot, with the
   profiled cost of d extra draft tokens (``ragged_cost``; without one, d drafts are priced
   as the padded step of ceil(d / B) drafts per row, which is coarser);
4. collapse to one width, since a padded engine verifies every row at the same k:
   ``objective`` (default): the width k maximising the same objective, expected accepted tokens
   per second, over what a padded step can verify (``slot_budget.padded_width``);
   ``max``: vLLM's per-row allocation of its budget, and the step verifies the largest
   allocation (every other row is padded up to it).

The cost model is fixed at construction, as vLLM profiles once at start-up: pass the table's
``CostSnapshot`` (T(B, k) with the draft forward when k > 0) and, for vLLM's budget at its own
granularity, ``TableRaggedCost`` of the same ``CostModel``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from policies.baselines.base import StepChoice, row_capacity, scored_outcomes
from policies.baselines.logistic_acceptance import LogisticAcceptance, confidence_features
from policies.baselines.ragged_cost import BudgetCosts, RaggedCost
from policies.baselines.slot_budget import (
    Bools,
    Floats,
    Ints,
    allocate_slots,
    draft_budget,
    expected_by_width,
    padded_width,
    ragged_costs,
    sorted_scores,
)
from policies.baselines.survival_ema import SurvivalEma
from policies.slot_allocator import RaggedChoice
from policies.slot_scoring import SlotScoring
from policies.types import PositionValues, StepCost, StepRow, Task, clamp_spec_tokens

COLLAPSE_RULES = ("objective", "max")


@dataclass(frozen=True)
class VllmAvSettings:
    """Defaults are vLLM's (``max_spec_tokens`` = its ``num_speculative_tokens``)."""

    max_spec_tokens: int
    min_spec_tokens: int = 1  # vLLM admits any count; a padded engine may want its minimum
    collapse: str = "objective"  # one of COLLAPSE_RULES
    history_weight: float = 0.2  # EMA weight of the newest step (#52559)
    refit_interval_steps: int = 100  # logistic: steps per refit (REFIT_INTERVAL)
    damping_observations: float = 50.0  # logistic: DAMPING_OBSERVATIONS
    ridge: float = 1e-3  # logistic: L2
    initial_slope: float = 0.5  # logistic: _INIT_SLOPE
    initial_intercept: float = -0.2  # logistic: _INIT_BIAS
    max_log_odds: float = 40.0  # logistic: _MAX_LOG_ODDS

    def __post_init__(self) -> None:
        if self.max_spec_tokens < 1:
            raise ValueError(f"max_spec_tokens must be >= 1, got {self.max_spec_tokens}")
        if not 1 <= self.min_spec_tokens <= self.max_spec_tokens:
            raise ValueError(
                f"min_spec_tokens must be in [1, max_spec_tokens={self.max_spec_tokens}], "
                f"got {self.min_spec_tokens}"
            )
        if self.collapse not in COLLAPSE_RULES:
            raise ValueError(f"collapse must be one of {COLLAPSE_RULES}, got {self.collapse!r}")


@dataclass(frozen=True)
class _Scored:
    """What was scored before a step, to label each row once its outcome arrives."""

    index: dict[Hashable, int]  # row id -> row of the arrays below
    seen: list[int]  # per row: len(accept_lengths) when scored (that step's outcome index)
    features: Floats  # [rows, K] logit(q)
    predictions: Floats  # [rows, K] the logistic's p, as scored
    has_confidence: Bools  # [rows] scored from confidence (else from the EMA)


class VllmAdaptiveVerification:
    """The step's k by vLLM's adaptive verification (see the module docstring); named
    ``vllm-av`` (objective collapse) or ``vllm-av-max``."""

    def __init__(
        self, settings: VllmAvSettings, cost: StepCost, ragged_cost: RaggedCost | None = None
    ):
        self.settings = settings
        self.name = "vllm-av" if settings.collapse == "objective" else "vllm-av-max"
        self._positions = settings.max_spec_tokens
        self._cost = cost
        self.logistic = LogisticAcceptance(
            self._positions,
            settings.refit_interval_steps,
            settings.damping_observations,
            settings.ridge,
            settings.initial_slope,
            settings.initial_intercept,
        )
        self.ema = SurvivalEma(self._positions, settings.history_weight)
        self._candidates = list(range(settings.min_spec_tokens, self._positions + 1))
        self._scored: _Scored | None = None
        self._costs: dict[int, Floats] = {}  # T(B, k) for k = 0..K, per batch size
        self._draft_costs = BudgetCosts(ragged_cost, self._positions) if ragged_cost else None

    def prepare(self, max_batch_size: int) -> None:
        """Build the cost tables of batch sizes 1..max_batch_size now, as vLLM does at
        start-up, so that no step pays for it (about 1k cost evaluations at batch 64)."""
        for batch in range(1, max_batch_size + 1):
            self._budget_costs(batch, batch * self._positions)

    def decide_step(self, rows: Sequence[StepRow], batch_size: int) -> StepChoice:
        self._learn(rows)
        self._scored = None
        if not rows or batch_size < 1:
            return StepChoice(0, f"{self.name}: empty batch -> k=0")
        capacities = np.array([row_capacity(r, self._positions) for r in rows], dtype=np.int64)
        survival = self._score(rows, capacities)
        cost_by_k = self._cost_by_k(batch_size)
        n = len(rows)
        scores = sorted_scores(survival, capacities)
        budget = draft_budget(scores, n, self._budget_costs(batch_size, len(scores)))
        drafts = expected_by_width(survival, capacities)
        if self.settings.collapse == "max":
            admitted = int(allocate_slots(survival, capacities, budget).max())
            k = clamp_spec_tokens(admitted, self.settings.min_spec_tokens, self._positions)
        else:
            k = padded_width(drafts, n, cost_by_k, self._candidates)
        gain = (n + drafts[k]) / cost_by_k[k] * cost_by_k[0] / n
        assert self._scored is not None, "_score remembers what it scored"
        source = "confidence" if self._scored.has_confidence.any() else "ema"
        reason = (
            f"{self.name}: B={batch_size} k={k} "
            f"budget={budget}/{len(scores)} est={source} {gain:.2f}x plain"
        )
        return StepChoice(k, reason)

    def decide_rows(self, rows: Sequence[StepRow], batch_size: int) -> RaggedChoice:
        """A ragged engine (each row at its own width): vLLM's own per-row allocation of its
        budget, no collapse (what Model Runner V2 runs)."""
        self._learn(rows)
        self._scored = None
        if not rows or batch_size < 1:
            return RaggedChoice([], f"{self.name}: empty batch")
        capacities = np.array([row_capacity(r, self._positions) for r in rows], dtype=np.int64)
        survival = self._score(rows, capacities)
        scores = sorted_scores(survival, capacities)
        budget = draft_budget(scores, len(rows), self._budget_costs(batch_size, len(scores)))
        counts = allocate_slots(survival, capacities, budget)
        assert self._scored is not None, "_score remembers what it scored"
        source = "confidence" if self._scored.has_confidence.any() else "ema"
        reason = f"{self.name}: B={batch_size} budget={budget}/{len(scores)} est={source}"
        return RaggedChoice([int(c) for c in counts], reason)

    def device_scoring(
        self, rows: Sequence[StepRow], batch_size: int
    ) -> tuple[RaggedChoice, SlotScoring]:
        """A ragged engine that allocates on the device (vLLM's own split): the budget from
        the confidence the rows carry (each row's from an earlier step; rows without one are
        priced by the EMA here, by the logistic on the device, as vLLM always has draft
        logits), and the logistic as it stands, for the device to apply to the fresh
        confidence. Learns nothing (pure in the policy's state): an engine may score a step
        ahead, while the previous one runs, and drop what it does not use; ``observed``
        learns from each step that ran."""
        if not rows or batch_size < 1:
            raise ValueError(f"{self.name}: a device scoring needs rows, got {len(rows)}")
        capacities = np.array([row_capacity(r, self._positions) for r in rows], dtype=np.int64)
        survival = self._score(rows, capacities)
        self._scored = None  # (``_score`` keeps it for the host path's learning)
        scores = sorted_scores(survival, capacities)
        budget = draft_budget(scores, len(rows), self._budget_costs(batch_size, len(scores)))
        logistic = self.logistic
        scoring = SlotScoring(
            capacities=capacities,
            tasks=np.zeros(len(rows), dtype=np.int64),
            base=np.tile(logistic.intercepts, (len(rows), 1)),
            edges=np.zeros(0),
            alpha=np.array([[logistic.slope]]),
            beta=np.zeros((1, 1)),
            scale=np.ones((1, 1)),
            max_log_odds=self.settings.max_log_odds,
            budget=min(budget, len(scores)),
        )
        reason = f"{self.name}: B={batch_size} budget={budget}/{len(scores)} (device)"
        return RaggedChoice([], reason), scoring

    def observed(
        self,
        scoring: SlotScoring,
        confidence: Sequence[PositionValues],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
    ) -> None:
        """A device-allocated step ran with ``scoring``: per row the confidence the device
        scored (its drafted positions), the k it verified and its accept length (bonus
        included). The EMA and the logistic learn from it as ``_learn`` does from a host
        step, the logistic's IRLS weights from the predictions the device made (the
        scoring's own coefficients)."""
        k = self._positions
        ks = [max(0, min(int(n), k)) for n in spec_tokens]
        hits = [max(0, min(int(a) - 1, n)) for a, n in zip(accept_lengths, ks, strict=True)]
        self.ema.record_step(ks, hits)
        rows = [
            StepRow(i, Task.CHAT, [], [], len(values), values)
            for i, values in enumerate(confidence)
        ]
        capacities = np.array([len(values) for values in confidence], dtype=np.int64)
        values, has = self._confidence(rows, capacities)
        if has.any():
            features = confidence_features(values, scoring.max_log_odds)
            positions = min(k, scoring.base.shape[1])
            z = scoring.alpha[0, 0] * features[:, :positions] + scoring.base[0, :positions]
            predictions = np.full(features.shape, 0.5)
            predictions[:, :positions] = 1.0 / (1.0 + np.exp(-z))
            self.logistic.observe(
                features[has],
                predictions[has],
                np.array(hits, dtype=np.int64)[has],
                np.array(ks, dtype=np.int64)[has],
            )
        self.logistic.end_step()

    def _cost_by_k(self, batch_size: int) -> Floats:
        """[K + 1] step time per k at ``batch_size`` (the cost is fixed: memoised)."""
        costs = self._costs.get(batch_size)
        if costs is None:
            ks = range(self._positions + 1)
            costs = np.array([self._cost.step_time_s(batch_size, k) for k in ks])
            self._costs[batch_size] = costs
        return costs

    def _budget_costs(self, batch_size: int, max_drafts: int) -> Floats:
        """cost(d) for d = 0..max_drafts, as vLLM's budget prices it (memoised per B)."""
        if self._draft_costs is None:
            return ragged_costs(self._cost_by_k(batch_size), batch_size, max_drafts)
        return self._draft_costs(batch_size, max_drafts)

    def _learn(self, rows: Sequence[StepRow]) -> None:
        """Fold in each row's outcome of the step it was last scored for, then count a step."""
        scored = self._scored
        if scored is not None:
            ks: list[int] = []
            hits: list[int] = []
            where: list[int] = []
            for j, k_ran, accepted in scored_outcomes(
                rows, scored.index, scored.seen, self._positions
            ):
                ks.append(k_ran)
                hits.append(accepted)
                where.append(j)
            self.ema.record_step(ks, hits)
            at = np.array(where, dtype=np.int64)
            labelled = scored.has_confidence[at]
            if labelled.any():
                rows_at = at[labelled]
                self.logistic.observe(
                    scored.features[rows_at],
                    scored.predictions[rows_at],
                    np.array(hits, dtype=np.int64)[labelled],
                    np.array(ks, dtype=np.int64)[labelled],
                )
        self.logistic.end_step()

    def _score(self, rows: Sequence[StepRow], capacities: Ints) -> Floats:
        """[rows, K] survival; remembers what it scored for the next step's learning."""
        confidence, has = self._confidence(rows, capacities)
        features = confidence_features(confidence, self.settings.max_log_odds)
        predictions = self.logistic.predict(features)
        survival = np.tile(self.ema.survival, (len(rows), 1))
        survival[has] = np.cumprod(predictions[has], axis=1)
        self._scored = _Scored(
            index={row.row_id: i for i, row in enumerate(rows)},
            seen=[len(row.accept_lengths) for row in rows],
            features=features,
            predictions=predictions,
            has_confidence=has,
        )
        return survival

    def _confidence(self, rows: Sequence[StepRow], capacities: Ints) -> tuple[Floats, Bools]:
        """[rows, K] top-1 draft probabilities (0.5 where absent) and which rows have them."""
        k = self._positions
        # ``is None``, not truthiness: an engine may hand numpy arrays.
        values = [() if r.draft_confidence is None else r.draft_confidence for r in rows]
        lengths = np.array([len(v) for v in values], dtype=np.int64)
        has = lengths > 0
        short = np.flatnonzero(has & (lengths < capacities))
        if short.size:
            i = int(short[0])
            raise ValueError(
                f"row {rows[i].row_id!r}: draft_confidence has {lengths[i]} positions but the "
                f"row may verify {capacities[i]}"
            )
        if has.all() and (lengths >= k).all():
            confidence = np.array([v[:k] for v in values], dtype=np.float64)
        else:
            confidence = np.full((len(rows), k), 0.5)
            for r in np.flatnonzero(has):
                width = min(k, int(lengths[r]))
                confidence[r, :width] = values[r][:width]
        if not np.all((confidence >= 0.0) & (confidence <= 1.0)):
            raise ValueError("draft_confidence must hold probabilities in [0, 1]")
        return confidence, has
