"""Per-slot allocator: each row of a ragged step gets its own k (issue 16).

An engine that verifies every row at its own width pays for the step's total tokens, not the
widest row's, so k is chosen per (request, position) slot. Per step:

1. learn: each row's outcome of the step it was last scored for labels its verified slots
   (accepted: 1; the first rejection: 0; later positions are censored) and updates the
   confidence calibration of its task;
2. score: slot (r, j) survives with probability ``prod_{i<=j} p[r, i]``, where

       logit p[r, i] = logit prior[task_r, i] + b[task_r] x_r + g[task_r, bin(c[r, i])]

   ``prior``: the task's per-position conditional acceptance (the goodput policy's online
   models); ``x_r``: the request's own recent steps' accepted drafts against what the prior
   expects of a step of their k (per position of the block, weighted ``recency_decay`` per
   step of age), whose weight ``b`` per task is learnt online (one Newton step per step on
   the labelled slots, against the full prediction, from ``recency_weight_start``): on the
   trained testbed pair a request's last steps predict its next far better than a fixed
   log-odds offset does (bench/survival_replay.py). With ``recency_decay`` 0 the term is
   instead ``offset_r``, the request's log-odds against the prior over its last
   ``request_window`` steps, shrunk toward 0 by ``request_strength`` steps. ``g``: the
   online calibration of the draft's confidence ``c`` (top-1 draft probability), per task
   and confidence bin (logit-spaced), forgetting at ``decay`` per step; until a bin has
   ``prior_strength`` labels it leans on ``cold_confidence_weight x (logit c - the
   uncalibrated log-odds)`` (half trust in the confidence as a probability). A row without
   confidence gets g = 0;
3. budget: every eligible slot sorted best first; the step verifies the ``d`` best with
   ``d* = argmax_d (B + sum of the d best survivals) / cost(B, d)`` (vLLM's rule, over our
   survival), ``cost`` the ragged step time of B rows plus d drafts; under the bounds below
   (a minimum above 1) the sum is what d slots can earn within them
   (``slot_scoring.bounded_budget``: the bounded allocation's price sweep), since a row of
   one to three good slots cannot spend them;
4. bounds: each row's k in {0} U [``min_spec_tokens``, capacity] (0: drafting off, its draft
   context still updated by the engine), the budget's d slots spent to maximise the expected
   accepted drafts under that bound (``slot_scoring.bounded_allocation``: a price per slot,
   then the rest to the rows already verifying), as the device allocates; never past the
   budget, whose token count is all a step pays for (past it, on a GPU, a matrix tile more).

Pure and deterministic: numpy over [rows, K] arrays, no clock, no I/O. The prior comes from
the caller (``rates(task)``), so the same object serves the embedded engine and the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from policies.baselines.base import scored_outcomes
from policies.baselines.ragged_cost import BudgetCosts, RaggedCost
from policies.baselines.slot_budget import (
    Bools,
    Floats,
    Ints,
    allocate_slots,
    draft_budget,
    eligible,
    sorted_scores,
)
from policies.slot_scoring import SlotScoring, bounded_budget
from policies.types import TASK_INDEX, TASKS, PositionValues, StepRow, Task

Rates = Callable[[Task], Sequence[float]]
_EPS = 1e-4


def _rows_seen(rows: Sequence[StepRow]) -> tuple[dict[Hashable, int], list[int]]:
    """Each row's index by id and its history length now: what ``_learn`` matches the step's
    outcomes against (the history lists grow in place once the step has run)."""
    return {r.row_id: i for i, r in enumerate(rows)}, [len(r.accept_lengths) for r in rows]


def logit(p: Floats) -> Floats:
    q = np.minimum(np.maximum(p, _EPS), 1 - _EPS)  # (np.clip costs more on small arrays)
    return np.log(q / (1.0 - q))


def sigmoid(x: Floats) -> Floats:
    return 1.0 / (1.0 + np.exp(-x))


def budgeted_allocation(
    survival: Floats, capacities: Ints, low: int, rows: int, costs: Callable[[int], Floats]
) -> tuple[Ints, int]:
    """k per row and the budget (draft slots the step pays for) of a scored step: the
    budget rule's d, then d slots spent within k in {0} U [min, capacity]
    (``slot_scoring.bounded_allocation``, as the device allocates): never past d, whose
    token count is all the step pays for. Under a minimum above 1 the rule weighs what
    the bound lets d slots earn (``slot_scoring.bounded_budget``), not the unbounded
    sorted survivals. ``costs(n)``: the step time with d = 0..n drafts, n the eligible
    slots."""
    if low <= 1:
        scores = sorted_scores(survival, capacities)
        budget = draft_budget(scores, rows, costs(len(scores)))
        return allocate_slots(survival, capacities, budget), budget
    slots = int(eligible(survival, capacities).sum())
    return bounded_budget(survival, capacities, low, rows, costs(slots))


@dataclass(frozen=True)
class AllocatorSettings:
    max_spec_tokens: int
    min_spec_tokens: int = 4
    confidence_bins: int = 12  # over logit(c) in [-4, 8] (top-1 probability 0.02 .. 0.9997)
    prior_strength: float = 30.0  # labels per bin before its calibration counts half
    cold_confidence_weight: float = 0.5  # an unlearnt bin: this share of confidence's log-odds
    decay: float = 0.998  # per step: calibration counts forget (follows a drifting workload)
    request_strength: float = 8.0  # verify steps of a request's own history that count half
    request_window: int = 16  # verify steps of a request's own history that count
    # The request's history as a learnt term b x_r (below) instead of the fixed offset: on
    # the trained testbed pair (H200) and the demo pair the fixed offset ranked slots worse
    # than the learnt term, which replaces it (bench/survival_replay.py, docs/allocator.md).
    recency_decay: float = 0.5  # x_r: weight of each older step (0: the fixed offset instead)
    recency_ridge: float = 1.0  # curvature added to b's Newton steps (damps the start)
    # b before it learns: about where it ends on the testbed pair, the demo pair and the
    # synthetic `realistic` set (1.0-3.8 per task, bench/results/survival_replay_*.json)
    recency_weight_start: float = 2.0

    def __post_init__(self) -> None:
        if self.max_spec_tokens < 1:
            raise ValueError(f"max_spec_tokens must be >= 1, got {self.max_spec_tokens}")
        if not 1 <= self.min_spec_tokens <= self.max_spec_tokens:
            raise ValueError(
                f"min_spec_tokens must be in [1, {self.max_spec_tokens}], "
                f"got {self.min_spec_tokens}"
            )
        if self.confidence_bins < 1 or not 0 < self.decay <= 1:
            raise ValueError("confidence_bins must be >= 1 and decay in (0, 1]")
        if not 0 <= self.recency_decay < 1 or self.recency_ridge <= 0:
            raise ValueError("recency_decay must be in [0, 1) and recency_ridge > 0")


@dataclass(frozen=True)
class RaggedChoice:
    """Per row k (same order as the rows) and a reason a person can read."""

    spec_tokens: list[int]
    reason: str


@dataclass(frozen=True)
class PreparedStep:
    """A step's decision up to the draft's confidence (``SlotAllocator.prepare_step``)."""

    rows: Sequence[StepRow]
    batch_size: int
    capacities: Ints  # [rows] the most each row may verify (0: it did not draft)
    tasks: Ints  # [rows] task index
    base_logit: Floats  # [rows, K] prior and own-history log-odds
    recency: Floats  # [rows] x_r, the rows' recent acceptance against the prior
    rows_seen: tuple[dict[Hashable, int], list[int]]  # ``_Scored.index`` and ``.seen``
    calibration: tuple[Floats, Floats]  # ``SlotAllocator.calibration()`` after the learning


_NO_TASKS = np.zeros(0, dtype=np.int64)
_NO_LOGITS = np.zeros((0, 1))
_NO_ROWS = np.zeros(0)


@dataclass(frozen=True)
class _Scored:
    index: dict[Hashable, int]
    seen: list[int]  # per row: len(accept_lengths) when scored
    tasks: Ints  # [rows] task index
    bins: Ints  # [rows, K] confidence bin, -1 without confidence
    base_logit: Floats  # [rows, K] log-odds before calibration
    logit: Floats  # [rows, K] the calibrated log-odds the slots were scored with
    recency: Floats  # [rows] x_r


class SlotAllocator:
    name = "allocator"

    def __init__(self, settings: AllocatorSettings, cost: RaggedCost):
        self.settings = settings
        self._cost = cost
        self._k = settings.max_spec_tokens
        shape = (len(TASKS), settings.confidence_bins)
        self._labels = np.zeros(shape)  # decayed label count per (task, bin)
        self._hits = np.zeros(shape)  # decayed accepted labels
        self._predicted = np.zeros(shape)  # decayed sum of base predictions
        self._recency_weight = np.full(len(TASKS), settings.recency_weight_start)  # b per task
        self._recency_curvature = np.zeros(len(TASKS))  # decayed sum of p (1 - p) x^2
        self._scored: _Scored | None = None
        self._edges = np.linspace(-4.0, 8.0, settings.confidence_bins + 1)[1:-1]
        self._budget_costs = BudgetCosts(cost, settings.max_spec_tokens)

    # -- calibration -------------------------------------------------------------------------

    def calibration(self) -> tuple[Floats, Floats]:
        """[tasks, bins] learnt log-odds correction of each confidence bin against the
        uncalibrated prediction, and its weight ``n / (n + prior_strength)`` (0 unlearned)."""
        n = self._labels
        rate = (self._hits + 0.5) / (n + 1.0)  # n >= 0: no division by zero
        predicted = (self._predicted + 0.5) / (n + 1.0)
        weight = n / (n + self.settings.prior_strength)
        return np.where(n > 0, logit(rate) - logit(predicted), 0.0), weight

    def recency_weights(self) -> dict[str, float]:
        """The learnt weight b of each task's recency term (``recency_weight_start`` until it
        learns)."""
        return {str(t.value): float(self._recency_weight[TASK_INDEX[t]]) for t in TASKS}

    # -- one step ----------------------------------------------------------------------------

    def drafting_rows(self, rows: Sequence[StepRow], batch_size: int, rates: Rates) -> Bools:
        """Before the draft forward: which rows are worth drafting at all. The same budget
        over survival from the task prior and the request's history alone (no confidence
        yet); a row the budget gives no slot does not draft this step, so the step saves its
        share of the draft forward (vLLM drafts every row). Learns nothing, remembers nothing."""
        if not rows:
            return np.zeros(0, dtype=np.bool_)
        capacities = self._capacities(rows)
        survival = self._survival(rows, rates, use_confidence=False)[0]
        scores = sorted_scores(survival, capacities)
        budget = draft_budget(scores, len(rows), self._costs(batch_size, len(scores)))
        drafted: Bools = allocate_slots(survival, capacities, budget) > 0
        return drafted

    def decide_rows(
        self,
        rows: Sequence[StepRow],
        batch_size: int,
        rates: Rates,
        drafted: Bools | None = None,
    ) -> RaggedChoice:
        """k per row. ``drafted``: the rows that ran the draft this step (default: all); the
        others get k = 0. The same as ``finish_step(prepare_step(...), confidence)`` with each
        row's own ``draft_confidence``."""
        prepared = self.prepare_step(rows, batch_size, rates, drafted)
        return self.finish_step(prepared, [r.draft_confidence for r in rows])

    def prepare_step(
        self,
        rows: Sequence[StepRow],
        batch_size: int,
        rates: Rates,
        drafted: Bools | None = None,
    ) -> PreparedStep:
        """The part of a step's decision that needs no draft confidence: learn from the rows'
        last outcomes, the rows' priors and own-history offsets, their capacities. An engine
        runs it while the device drafts, so only ``finish_step`` waits between draft and
        verify. Call ``finish_step`` once with the same rows before the next ``prepare_step``."""
        self._learn(rows)
        self._scored = None
        capacities = self._capacities(rows)
        if drafted is not None:
            capacities = np.where(drafted, capacities, 0)
        tasks, base_logit, recency = (
            self._base(rows, rates) if rows else (_NO_TASKS, _NO_LOGITS, _NO_ROWS)
        )
        return PreparedStep(
            rows,
            batch_size,
            capacities,
            tasks,
            base_logit,
            recency,
            _rows_seen(rows),
            self.calibration(),
        )

    def finish_step(
        self, prepared: PreparedStep, confidence: Sequence[PositionValues | None]
    ) -> RaggedChoice:
        """k per row of a prepared step from its rows' draft confidence (per row, its drafted
        positions; None or empty: none)."""
        return self._finish(prepared, confidence)[0]

    def _finish(
        self, prepared: PreparedStep, confidence: Sequence[PositionValues | None]
    ) -> tuple[RaggedChoice, int]:
        """``finish_step``'s choice and the budget it allocated."""
        rows, batch_size = prepared.rows, prepared.batch_size
        if not rows:
            return RaggedChoice([], "allocator: empty batch"), 0
        survival = self.score_step(prepared, confidence)
        counts, budget = self._allocated(survival, prepared)
        n = len(rows)
        drafts = int(counts.sum())
        expected = float(np.where(eligible(survival, counts), survival, 0.0).sum())
        gain = (n + expected) / self._cost.step_time_s(batch_size, drafts)
        gain *= self._cost.step_time_s(batch_size, 0) / n
        drafting = int((counts > 0).sum())
        reason = (
            f"allocator: B={batch_size} {drafts} drafts over {drafting}/{n} rows "
            f"(k {int(counts.min())}-{int(counts.max())}), est {expected:.1f} accepted, "
            f"{gain:.2f}x plain"
        )
        return RaggedChoice([int(c) for c in counts], reason), budget

    def score_step(
        self, prepared: PreparedStep, confidence: Sequence[PositionValues | None]
    ) -> Floats:
        """Survival [rows, K] of a prepared step's slots from its rows' confidence, remembered
        for the next step's learning (``finish_step``'s scoring, without the budget)."""
        survival, self._scored = self._calibrated(
            prepared.tasks,
            prepared.base_logit,
            self._confidence_values(confidence),
            prepared.rows_seen,
            prepared.calibration,
            prepared.recency,
        )
        return survival

    def slot_scoring(self, prepared: PreparedStep, budget: int) -> SlotScoring:
        """The prepared step's scoring for the device (``policies.slot_scoring``): the same
        survival as ``finish_step`` gives a row whose every slot has a confidence, and the
        host's ``budget`` of draft slots (``finish_step``'s total on the confidence the host
        has, e.g. each row's from its previous step)."""
        learnt, weight = prepared.calibration
        alpha = (1.0 - weight) * self.settings.cold_confidence_weight
        return SlotScoring(
            capacities=prepared.capacities,
            tasks=prepared.tasks,
            base=prepared.base_logit,
            edges=self._edges,
            alpha=alpha,
            beta=weight * learnt,
            scale=1.0 - alpha,
            max_log_odds=float(logit(np.array(1.0))),
            budget=budget,
            min_spec_tokens=self.settings.min_spec_tokens,
            recency=prepared.recency,
        )

    def device_scoring(
        self,
        rows: Sequence[StepRow],
        batch_size: int,
        rates: Rates,
        confidence: Sequence[PositionValues | None],
    ) -> tuple[RaggedChoice, SlotScoring]:
        """A step allocated on the device, scored ahead: the budget is ``finish_step``'s total
        on ``confidence`` (each row's from an earlier step; None: the prior and history
        alone), the scoring the allocator's survival for the device to apply to the fresh
        confidence. Learns nothing (an engine may score a step while the previous one runs
        and drop what it does not use); ``observed`` learns from each step that ran."""
        tasks, base_logit, recency = (
            self._base(rows, rates) if rows else (_NO_TASKS, _NO_LOGITS, _NO_ROWS)
        )
        prepared = PreparedStep(
            rows,
            batch_size,
            self._capacities(rows),
            tasks,
            base_logit,
            recency,
            _rows_seen(rows),
            self.calibration(),
        )
        kept = self._scored
        choice, budget = self._finish(prepared, confidence)
        self._scored = kept  # (``finish_step`` remembers for the host path's learning)
        # The budget, not the bounded allocation's total: the device fills every slot of the
        # token count the budget rounds up to, bounds within it.
        scoring = self.slot_scoring(prepared, budget)
        return replace(choice, reason=f"{choice.reason} (device)"), scoring

    def observed(
        self,
        scoring: SlotScoring,
        confidence: Sequence[PositionValues | None],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
    ) -> None:
        """A device-allocated step ran with ``scoring``: per row the confidence the device
        scored (its drafted positions), the k it verified and its accept length (bonus
        included). The calibration learns from it as ``_learn`` does from a host step: each
        verified slot up to the first rejection labelled, binned by the confidence the device
        read, against the uncalibrated prediction it was scored with; one step's decay."""
        self._decay()
        rows = len(spec_tokens)
        if rows == 0 or rows != scoring.base.shape[0]:
            return
        ran = np.minimum(np.asarray(spec_tokens, dtype=np.int64), self._k)
        accepted = np.clip(np.asarray(accept_lengths, dtype=np.int64) - 1, 0, ran)
        values = self._confidence_values(confidence)
        recency = scoring.recency if scoring.recency is not None else np.zeros(rows)
        scored = self._scored_slots(
            scoring.tasks, scoring.base, values, ({}, []), self.calibration(), recency
        )
        self._fold(scored, ran, accepted)

    def _bins(self, confidence: Floats) -> tuple[Floats, Ints]:
        """Log-odds of the confidence [rows, K] (clipped; NaN read as 0.5) and its bins
        (-1 where NaN)."""
        has = ~np.isnan(confidence)
        full = bool(has.all())
        confidence_logit = logit(confidence if full else np.where(has, confidence, 0.5))
        bins = np.searchsorted(self._edges, confidence_logit)
        if not full:
            bins = np.where(has, bins, -1)
        return confidence_logit, bins

    def _allocated(self, survival: Floats, prepared: PreparedStep) -> tuple[Ints, int]:
        """k per row and the budget of a scored step (``budgeted_allocation``)."""
        rows, low = len(prepared.rows), self.settings.min_spec_tokens
        return budgeted_allocation(
            survival,
            prepared.capacities,
            low,
            rows,
            lambda slots: self._costs(prepared.batch_size, slots),
        )

    def _costs(self, batch_size: int, max_drafts: int) -> Floats:
        return self._budget_costs(batch_size, max_drafts)

    def _capacities(self, rows: Sequence[StepRow]) -> Ints:
        k = self._k
        return np.array([max(0, min(k, r.max_spec_tokens)) for r in rows], dtype=np.int64)

    def _survival(
        self, rows: Sequence[StepRow], rates: Rates, use_confidence: bool
    ) -> tuple[Floats, _Scored]:
        tasks, base_logit, recency = self._base(rows, rates)
        values = [r.draft_confidence for r in rows] if use_confidence else []
        confidence = self._confidence_values(values, len(rows))
        return self._calibrated(
            tasks, base_logit, confidence, _rows_seen(rows), self.calibration(), recency
        )

    def _base(self, rows: Sequence[StepRow], rates: Rates) -> tuple[Ints, Floats, Floats]:
        """[rows] task index, [rows, K] log-odds from the task prior and each request's own
        history (before the confidence), and [rows] the rows' recency feature x_r."""
        k = self._k
        tasks = np.array([TASK_INDEX[r.task] for r in rows], dtype=np.int64)
        priors = np.full((len(TASKS), k), 0.5)  # rows of absent tasks: never read
        for t, i in TASK_INDEX.items():
            if (tasks == i).any():
                values = list(rates(t))[:k]
                values += [values[-1] if values else 0.5] * (k - len(values))
                priors[i] = values
        prior_logit = logit(priors)[tasks]
        shift, recency = self._history(rows, priors, tasks)
        return tasks, prior_logit + shift[:, None], recency

    def _calibrated(
        self,
        tasks: Ints,
        base_logit: Floats,
        confidence: Floats,
        rows_seen: tuple[dict[Hashable, int], list[int]],
        calibration: tuple[Floats, Floats],
        recency: Floats,
    ) -> tuple[Floats, _Scored]:
        """Survival [rows, K] from the base log-odds and the confidence's calibration (on a
        two-phase step's path between draft and verify), and what was scored."""
        scored = self._scored_slots(tasks, base_logit, confidence, rows_seen, calibration, recency)
        survival: Floats = np.cumprod(sigmoid(scored.logit), axis=1, dtype=np.float64)
        return survival, scored

    def _scored_slots(
        self,
        tasks: Ints,
        base_logit: Floats,
        confidence: Floats,
        rows_seen: tuple[dict[Hashable, int], list[int]],
        calibration: tuple[Floats, Floats],
        recency: Floats,
    ) -> _Scored:
        """The calibrated log-odds [rows, K] of every slot and what learning needs of them
        (the usual case, every slot with a confidence, skips the masking)."""
        has = ~np.isnan(confidence)
        full = bool(has.all())
        confidence_logit, bins = self._bins(confidence)
        learnt, weight = calibration
        at = tasks[:, None] * learnt.shape[1] + np.maximum(bins, 0)  # flat (task, bin)
        slot_weight = weight.ravel()[at]
        # Until a bin has labels, trust the confidence half way: its log-odds against the
        # uncalibrated prediction, times ``cold_confidence_weight``.
        cold = self.settings.cold_confidence_weight * (confidence_logit - base_logit)
        correction = slot_weight * learnt.ravel()[at] + (1.0 - slot_weight) * cold
        calibrated = base_logit + (correction if full else np.where(has, correction, 0.0))
        index, seen = rows_seen
        return _Scored(
            index=index,
            seen=seen,
            tasks=tasks,
            bins=bins,
            base_logit=base_logit,
            logit=calibrated,
            recency=recency,
        )

    def _confidence_values(
        self, values: Sequence[PositionValues | None], num_rows: int | None = None
    ) -> Floats:
        """[rows, K] draft confidence, NaN where a row has none (``values`` empty: none at
        all, for ``num_rows`` rows)."""
        k = self._k
        if values and all(v is not None and len(v) >= k for v in values):
            full: Floats = np.array([v[:k] for v in values], dtype=np.float64)  # type: ignore[index]
            return full
        confidence = np.full((len(values) if num_rows is None else num_rows, k), np.nan)
        for i, v in enumerate(values):
            if v is not None and len(v):
                given = np.asarray(v[:k], dtype=np.float64)
                confidence[i, : len(given)] = given
        return confidence

    def _history(
        self, rows: Sequence[StepRow], priors: Floats, tasks: Ints
    ) -> tuple[Floats, Floats]:
        """[rows] each request's own history term in log-odds, and [rows] x_r. With
        ``recency_decay`` > 0 the term is b x_r (``_recency``; x_r 0 without a drafted step);
        with 0 it is the request's log-odds against its task's prior over its last
        ``request_window`` verify steps (accepted drafts against what the prior expected of
        the positions those steps labelled), shrunk by ``request_strength`` steps, and x_r
        is 0. Only the term in use is computed."""
        window, k = self.settings.request_window, self._k
        # One array build from plain lists (a numpy row assignment per row costs ~10x more).
        recent_lengths: list[Sequence[int]] = []
        recent_ks: list[Sequence[int]] = []
        for r in rows:
            n = min(window, len(r.accept_lengths), len(r.spec_tokens))
            pad = [0] * (window - n)
            if n:
                recent_lengths.append(pad + list(r.accept_lengths[len(r.accept_lengths) - n :]))
                recent_ks.append(pad + list(r.spec_tokens[len(r.spec_tokens) - n :]))
            else:
                recent_lengths.append(pad)
                recent_ks.append(pad)
        lengths = np.array(recent_lengths, dtype=np.int64).reshape(len(rows), window)
        ks = np.array(recent_ks, dtype=np.int64).reshape(len(rows), window)
        ran = np.minimum(ks, k)
        drafted = ran > 0
        accepted = np.clip(lengths - 1, 0, ran)
        labelled = np.where(drafted, np.minimum(accepted + 1, ran), 0)
        hits_by_step = np.where(drafted, accepted, 0)
        if self.settings.recency_decay > 0:  # the learnt weight replaces the fixed offset
            survival = np.cumprod(priors, axis=1)
            mean_run = np.concatenate([np.zeros((len(priors), 1)), np.cumsum(survival, 1)], 1)
            recency = self._recency(hits_by_step, mean_run[tasks[:, None], ran], drafted)
            return self._recency_weight[tasks] * recency, recency
        cumulative = np.concatenate([np.zeros((len(priors), 1)), np.cumsum(priors, axis=1)], 1)
        expected = cumulative[tasks[:, None], labelled].sum(axis=1)
        hits = hits_by_step.sum(axis=1)
        trials = labelled.sum(axis=1)
        steps = drafted.sum(axis=1)
        weight = steps / (steps + self.settings.request_strength)
        rate = (hits + 1.0) / (trials + 2.0)
        predicted = (expected + 1.0) / (trials + 2.0)
        offsets: Floats = np.where(trials > 0, weight * (logit(rate) - logit(predicted)), 0.0)
        return offsets, np.zeros(len(rows))

    def _recency(self, accepted: Floats, expected: Floats, drafted: Bools) -> Floats:
        """[rows] x_r from per-step [rows, window] accepted drafts, what the prior expects a
        step of that k to accept, and whether the step drafted (oldest step first): the
        recent steps' surplus of accepted drafts over the prior, per drafted position of the
        block (steps weighted ``recency_decay`` per step of age)."""
        decay = self.settings.recency_decay
        if accepted.shape[1] == 0:
            return np.zeros(accepted.shape[0])
        age = np.arange(accepted.shape[1] - 1, -1, -1, dtype=np.float64)
        weights = np.where(drafted, decay**age, 0.0)
        surplus = (accepted - expected) / self._k
        total = weights.sum(axis=1)
        mean = (weights * surplus).sum(axis=1) / np.maximum(total, 1e-12)
        x: Floats = np.where(total > 0, mean, 0.0)
        return x

    def _learn(self, rows: Sequence[StepRow]) -> None:
        scored = self._scored
        self._decay()
        if scored is None:
            return
        outcomes = scored_outcomes(rows, scored.index, scored.seen, self._k)
        if not outcomes:
            return
        where, ran, accepted = (np.array(x, dtype=np.int64) for x in zip(*outcomes, strict=True))
        self._fold(_rows_of(scored, where), ran, accepted)

    def _decay(self) -> None:
        decay = self.settings.decay
        self._labels *= decay
        self._hits *= decay
        self._predicted *= decay
        self._recency_curvature *= decay

    def _fold(self, scored: _Scored, ran: Ints, accepted: Ints) -> None:
        """One step's outcomes into the calibration and the recency weights: per scored row
        its task, its slots' confidence bins, base and calibrated log-odds [rows, K] and x_r,
        the k it ran and the drafts it accepted."""
        tasks, bins, base_logit = scored.tasks, scored.bins, scored.base_logit
        positions = np.arange(self._k)[None, :]
        labelled = positions < np.minimum(accepted + 1, ran)[:, None]
        if self.settings.recency_decay > 0 and labelled.any():
            self._learn_recency(scored, labelled, positions < accepted[:, None])
        use = labelled & (bins >= 0)
        if not use.any():
            return
        shape = self._labels.shape
        flat = (tasks[:, None] * shape[1] + np.maximum(bins, 0))[use]
        size = shape[0] * shape[1]
        label = (positions < accepted[:, None])[use].astype(np.float64)
        self._labels += np.bincount(flat, minlength=size).reshape(shape)
        self._hits += np.bincount(flat, weights=label, minlength=size).reshape(shape)
        base = sigmoid(base_logit[:, : self._k][use])
        self._predicted += np.bincount(flat, weights=base, minlength=size).reshape(shape)

    def _learn_recency(self, scored: _Scored, labelled: Bools, label: Bools) -> None:
        """One Newton step per task for b on the step's labelled slots, against the
        calibrated prediction they were scored with (its curvature decays as the
        calibration's counts do, plus ``recency_ridge``). x is per row, so the slots are
        summed per row first."""
        x = scored.recency
        if not x.any():
            return
        p = sigmoid(scored.logit[:, : self._k])
        residual = np.where(labelled, label - p, 0.0).sum(axis=1)
        information = np.where(labelled, p * (1.0 - p), 0.0).sum(axis=1)
        n = len(TASKS)
        gradient = np.bincount(scored.tasks, weights=residual * x, minlength=n)
        self._recency_curvature += np.bincount(
            scored.tasks, weights=information * x * x, minlength=n
        )
        self._recency_weight += gradient / (self._recency_curvature + self.settings.recency_ridge)


def _rows_of(scored: _Scored, where: Ints) -> _Scored:
    """The scored rows ``where`` (the rows a step's outcomes label)."""
    return replace(
        scored,
        tasks=scored.tasks[where],
        bins=scored.bins[where],
        base_logit=scored.base_logit[where],
        logit=scored.logit[where],
        recency=scored.recency[where],
    )
