"""Choosers for a ragged engine (each row verified at its own width) that read the draft's
confidence: draftctl's per-slot allocator and vLLM's adaptive verification without collapse.

The simulator has no draft model, so confidence is synthetic (``synthetic_confidence``), the
model the engine's synthetic-acceptance mode also uses (policies/confidence_model.py): per
drafted position, ``c = sigmoid(bias + separation * (y - 1/2) + e)``, ``e ~ N(0, 1)``, ``y`` =
whether the position survives this step (from the request's trace: positions before its
accepted run survive, the rest do not), ``separation = sqrt(2) * Phi^-1(auc)``; the scenario
sets ``acceptance.confidence_auc`` from what a trained pair measured
(bench/draft_confidence.py). Deterministic per (seed, request, step).
"""

from __future__ import annotations

import bisect
import functools
import math
import random
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from policies.baselines.ragged_cost import BudgetCosts, TableRaggedCost
from policies.baselines.vllm_av import VllmAdaptiveVerification, VllmAvSettings
from policies.confidence_model import CONFIDENCE_BIAS, confidence_logit, separation
from policies.costmodel import CostModel, CostTable
from policies.model import GoodputSpec
from policies.online import OnlineModels
from policies.slot_allocator import AllocatorSettings, SlotAllocator, budgeted_allocation
from policies.step_mode import ModeSettings, StepModeChooser
from policies.types import StepRow, Task, max_spec_tokens
from sim.choosers import GoodputChooser, record_online, true_rates
from sim.request import SimRequest
from sim.traces import parametric_rates


def synthetic_confidence(
    request: SimRequest, positions: int, gap: float, seed: int
) -> tuple[float, ...]:
    """The draft's top-1 probability at positions 1..``positions`` of this step (see module)."""
    survives = request.peek_accepted(positions)
    key = f"{seed}:{request.spec.key}:{request.num_steps}".encode()
    rng = random.Random(zlib.crc32(key))
    out = []
    for j in range(positions):
        y = 1.0 if j < survives else 0.0
        z = confidence_logit(y, rng.gauss(0.0, 1.0), gap)
        out.append(1.0 / (1.0 + math.exp(-z)))
    return tuple(out)


class _RaggedBase:
    """Rows with synthetic confidence for every step; the task prior from OnlineModels."""

    def __init__(
        self,
        spec: GoodputSpec,
        table: CostTable,
        block_size: int,
        auc: float | None,
        seed: int,
        models: OnlineModels | None = None,
    ):
        self._models = models or OnlineModels(spec, block_size, table)
        self._block_size = block_size
        self._k = max_spec_tokens(block_size)
        self._gap = None if auc is None else separation(auc)
        self._seed = seed

    # The server's own cost section when it differs from the scenario's (a ragged server in a
    # fleet of padded ones); None: the scenario's.
    engine_costs: Any = None
    # Share of the last step's rows that ran the draft forward (the simulator charges the
    # draft for them: confidence comes from the draft, so a row that sees it has drafted).
    last_drafted_share: float | None = None

    def _rows(
        self, batch: Sequence[SimRequest], drafted: Sequence[bool] | None = None
    ) -> list[StepRow]:
        rows = []
        for i, r in enumerate(batch):
            confidence = (
                None
                if self._gap is None or (drafted is not None and not drafted[i])
                else synthetic_confidence(r, self._k, self._gap, self._seed)
            )
            rows.append(
                StepRow(r.spec.key, r.spec.task, r.accept_history, r.k_history, self._k, confidence)
            )
        return rows

    def _rates(self, task: Task) -> Sequence[float]:
        rates: Sequence[float] = self._models.observe(task)["accept_rates"]
        return rates

    def record(
        self,
        batch: Sequence[SimRequest],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
        step: tuple[float, float, float],
    ) -> None:
        tasks = [r.spec.task for r in batch]
        record_online(self._models, tasks, spec_tokens, accept_lengths, step)


class AllocatorChooser(_RaggedBase):
    """draftctl's per-slot allocator (policies.slot_allocator) with the goodput policy's
    online models as its per-task prior and a fixed ragged cost from the table."""

    def __init__(
        self,
        spec: GoodputSpec,
        table: CostTable,
        cost: CostModel,
        block_size: int,
        min_k: int,
        auc: float | None,
        seed: int,
        gated: bool = False,
        models: OnlineModels | None = None,
        prior_only: bool = False,
    ):
        """``prior_only``: one-phase ragged steps, each row's k from the task prior and its own
        history before the draft (no confidence read, so no two-phase wait, and the draft
        computes the step's widest k: narrow when it is at most 7), "allocator-prior"."""
        super().__init__(spec, table, block_size, None if prior_only else auc, seed, models)
        self.name = "allocator" if auc is not None else "allocator-no-confidence"
        if prior_only:
            self.name = "allocator-prior"
        self._gated = gated and auc is not None and not prior_only
        if self._gated:
            self.name += "-gated"
        # What each row drafts (goodput's ``slots_draft_cap``), and so the most it may verify.
        cap = spec.slots_draft_cap
        widest = self._k if cap is None else min(self._k, cap)
        self.last_drafted_positions: int | None = None if prior_only else widest
        settings = AllocatorSettings(
            max_spec_tokens=widest,
            min_spec_tokens=min(min_k, widest),
        )
        self._allocator = SlotAllocator(settings, TableRaggedCost(cost))

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        if not self._gated:
            self.last_drafted_share = 1.0 if self._gap is not None else None
            rows = self._rows(batch)
            return self._allocator.decide_rows(rows, len(batch), self._rates).spec_tokens
        plain = self._rows(batch, [False] * len(batch))  # what is known before drafting
        drafted = self._allocator.drafting_rows(plain, len(batch), self._rates)
        self.last_drafted_share = float(drafted.mean())
        rows = self._rows(batch, [bool(d) for d in drafted])
        choice = self._allocator.decide_rows(rows, len(batch), self._rates, drafted)
        return choice.spec_tokens


class VllmAvRaggedChooser(_RaggedBase):
    """vLLM's adaptive verification on a ragged engine: its per-row allocation, its logistic
    confidence estimator (EMA survival without confidence), its budget over the same cost."""

    def __init__(
        self,
        spec: GoodputSpec,
        table: CostTable,
        cost: CostModel,
        block_size: int,
        auc: float | None,
        seed: int,
    ):
        super().__init__(spec, table, block_size, auc, seed)
        self.name = "vllm-av" if auc is not None else "vllm-av-no-confidence"
        self.last_drafted_positions = self._k  # every row drafts the whole block
        ragged = TableRaggedCost(cost)
        self._policy = VllmAdaptiveVerification(
            VllmAvSettings(max_spec_tokens=self._k), RaggedStepCost(ragged), ragged
        )

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        self.last_drafted_share = 1.0 if self._gap is not None else None  # every row drafts
        return self._policy.decide_rows(self._rows(batch), len(batch)).spec_tokens


def run_posterior(prior: np.ndarray, llr: np.ndarray, joint: bool = True) -> np.ndarray:
    """[rows, K] posterior probability that drafted position j = 1..K survives this step.

    ``prior`` [rows, K + 1]: P(run >= j) for j = 0..K before the confidence (1 at j = 0,
    non-increasing); ``llr`` [rows, K]: each position's log-likelihood ratio of surviving
    against not, from its confidence. Survival is a prefix (a run of length a: positions
    1..a survive), so the likelihood of a run of length a is the sum of the first a ratios.
    ``joint``: the posterior of the run's length given every position's confidence;
    otherwise each position j given positions 1..j alone (a later position's confidence read
    as saying nothing of the earlier ones, as on a real pair), kept non-increasing."""
    rows, k = llr.shape
    cumulative = np.concatenate((np.zeros((rows, 1)), np.cumsum(llr, axis=1)), axis=1)
    exactly = prior - np.concatenate((prior[:, 1:], np.zeros((rows, 1))), axis=1)
    with np.errstate(divide="ignore"):
        log_exactly = np.log(np.maximum(exactly, 0.0)) + cumulative  # run == a, a = 0..K
        if not joint:  # P(run >= j | c_1..j): runs of j or more look alike to positions <= j
            shorter = np.logaddexp.accumulate(log_exactly, axis=1)[:, :k]  # runs < j
            longer = np.log(np.maximum(prior[:, 1:], 0.0)) + cumulative[:, 1:]
            return np.minimum.accumulate(1.0 / (1.0 + np.exp(shorter - longer)), axis=1)
    log_exactly -= log_exactly.max(axis=1, keepdims=True)
    posterior = np.exp(log_exactly)
    posterior /= posterior.sum(axis=1, keepdims=True)
    at_least = np.cumsum(posterior[:, ::-1], axis=1)[:, ::-1]  # P(run >= j), j = 0..K
    return np.asarray(at_least[:, 1:])


class ExactPosteriorChooser(_RaggedBase):
    """A reference, not a policy: the survival a policy that sees no step's outcome ahead of
    time could at best estimate on this model, allocated by vLLM's budget rule under the
    policy file's bounds (``policies.slot_allocator.budgeted_allocation``, as the allocator's).

    It knows each request's true per-position rates (parametric traces) and every
    mispredicted token already passed, so where the current run of the hard-token model
    started (``sim/traces.py``: a run restarts after each hard token and every
    ``block_size`` positions of a full block); from those, the prior of how many of this
    step's drafts survive. It reads the draft's confidence with the exact likelihood the
    synthetic confidence is drawn from (``policies.confidence_model``: each drafted
    position's log-odds, less the bias, times the separation is its log-likelihood ratio of
    surviving): ``joint`` over every position at once (the synthetic model's structure: a
    confident late position speaks for the earlier ones), else each position from those up
    to it (``run_posterior``). What it cannot know is the step's own draw. Not a bound over
    every policy: the per-step rule does not value where a step leaves a row's run (a verify
    that passes a mispredicted token starts the next step on a fresh run)."""

    def __init__(
        self,
        spec: GoodputSpec,
        table: CostTable,
        cost: CostModel,
        block_size: int,
        min_k: int,
        auc: float,
        seed: int,
        joint: bool = True,
        task_rates: Mapping[Task, Sequence[float]] | None = None,
    ):
        """``task_rates``: the prior from each task's median request instead, every step read
        as the start of a run (what a policy knows of a request before its history: the
        task), "bayes-prefix-task"."""
        super().__init__(spec, table, block_size, auc, seed)
        task = "-task" if task_rates is not None else ""
        bounds = "" if min_k > 1 else "-min1"
        self.name = ("bayes-bound" if joint else "bayes-prefix") + task + bounds
        self.last_drafted_positions = self._k  # every row drafts the whole block
        self._low = min(min_k, self._k)
        self._joint = joint
        self._task_rates = task_rates
        self._costs = BudgetCosts(TableRaggedCost(cost), self._k)

    def survival(self, batch: Sequence[SimRequest]) -> np.ndarray:
        """[rows, K] posterior probability that each drafted position survives this step."""
        k, block = self._k, self._block_size
        assert self._gap is not None, "built with a confidence AUC"
        prior = np.ones((len(batch), k + 1))  # P(at least j drafts survive), j = 0..K
        llr = np.zeros((len(batch), k))
        for i, request in enumerate(batch):
            if self._task_rates is not None:
                rates, start = self._task_rates[request.spec.task], request.position
            else:
                rates = true_rates(request)
                hard = request.spec.trace.hard_positions
                passed = bisect.bisect_left(hard, request.position)
                start = hard[passed - 1] + 1 if passed else 0  # the current run's first position
            offsets = (request.position - start + np.arange(k)) % block
            conditional = np.where(offsets < k, np.asarray(rates)[np.minimum(offsets, k - 1)], 1)
            prior[i, 1:] = np.cumprod(conditional)
            confidence = np.asarray(synthetic_confidence(request, k, self._gap, self._seed))
            llr[i] = self._gap * (np.log(confidence / (1.0 - confidence)) - CONFIDENCE_BIAS)
        return run_posterior(prior, llr, self._joint)

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        self.last_drafted_share = 1.0  # every row drafts
        if not batch:
            return []
        capacities = np.full(len(batch), self._k, dtype=np.int64)
        counts, _ = budgeted_allocation(
            self.survival(batch),
            capacities,
            self._low,
            len(batch),
            lambda slots: self._costs(len(batch), slots),
        )
        return [int(c) for c in counts]


class GoodputAutoChooser:
    """The goodput policy's ``step_mode: auto`` as the embedded engine runs it on ragged
    verifies: below ``slots_min_batch`` rows one-phase steps (one k for the step, chosen
    before the draft: ``policies.batch_width.BatchWidth``); from there, per batch-size bucket,
    one-phase or two-phase (the per-slot allocator on the draft's confidence), whichever
    emitted more tokens per second of measured step time (``policies.step_mode``, the
    engine's own chooser). Both modes read one set of online models, as the engine's do
    (``one`` records every step into them). As the engine's (session 56), a two-phase step runs
    plain while the one-phase decision is plain, and plain steps are neither timed into the
    chooser nor counted in its schedule."""

    name = "goodput-auto"
    engine_costs: Any = None

    def __init__(self, spec: GoodputSpec, one: GoodputChooser, two: AllocatorChooser):
        self._one, self._two = one, two
        self._spec = spec
        self._min_rows = spec.slots_min_batch
        self._modes = StepModeChooser(ModeSettings.of(spec))
        self._two_phase = False
        self.last_drafted_share: float | None = None
        self.last_drafted_positions: int | None = None  # None: one-phase, its widest k
        self.two_phase_steps = 0

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        rows = len(batch)
        eligible = rows >= self._min_rows
        self._two_phase = eligible and self._modes.peek(rows)
        one_phase = None  # the batch-wide decision, where a two-phase step waits on it
        if self._two_phase and self._waits_while_plain(rows):
            one_phase = self._one.choose(batch, now_s)
            self._two_phase = max(one_phase, default=0) > 0
        if not self._two_phase:
            self.last_drafted_share = self.last_drafted_positions = None
            if one_phase is None:
                one_phase = self._one.choose(batch, now_s)
            if eligible and max(one_phase, default=0) > 0:  # (a plain step: not advanced)
                self._modes.decide(rows)
            return one_phase
        self._modes.decide(rows)
        self.two_phase_steps += 1
        spec_tokens = self._two.choose(batch, now_s)
        self.last_drafted_share = self._two.last_drafted_share
        self.last_drafted_positions = self._two.last_drafted_positions
        return spec_tokens

    def _waits_while_plain(self, rows: int) -> bool:
        """A two-phase step the batch-wide decision turns plain when it is k = 0, as the
        engine's (``mode_probe_when_plain`` for the chooser's measurements,
        ``mode_two_phase_when_plain`` for its two-phase incumbent's steps)."""
        if self._modes.incumbent(rows) is True:
            return not self._spec.mode_two_phase_when_plain
        return not self._spec.mode_probe_when_plain

    def record(
        self,
        batch: Sequence[SimRequest],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
        step: tuple[float, float, float],
    ) -> None:
        drafted = self._two_phase or max(spec_tokens, default=0) > 0
        if drafted and len(batch) >= self._min_rows:  # (a plain step is neither mode's)
            self._modes.record(len(batch), self._two_phase, sum(accept_lengths), step[0])
        self._one.record(batch, spec_tokens, accept_lengths, step)  # the shared models


class RaggedStepCost:
    """T(B, k) as B rows of k drafts each on the ragged cost (vLLM's padded-width table)."""

    def __init__(self, ragged: TableRaggedCost):
        self._ragged = ragged

    def step_time_s(self, batch_size: int, spec_tokens: int) -> float:
        return self._ragged.step_time_s(batch_size, batch_size * spec_tokens)


def ragged_choosers(scenario: Any, table: CostTable, cost: CostModel) -> list[Any]:
    """The confidence-reading choosers a ragged scenario asks for (``policies``)."""
    chosen = scenario.policies
    if scenario.cost.batch_verify != "ragged":
        return []
    auc = scenario.acceptance.confidence_auc
    min_k = min(chosen.min_spec_tokens, max_spec_tokens(scenario.block_size))
    out: list[Any] = []
    allocator = functools.partial(
        AllocatorChooser,
        chosen.goodput,
        table,
        cost,
        scenario.block_size,
        min_k,
        auc,
        scenario.seed,
    )
    for gated in (False, True):
        if chosen.include_allocator and (not gated or chosen.include_allocator_gated):
            out.append(allocator(gated))
    if chosen.include_allocator_prior:
        out.append(allocator(prior_only=True))
    if chosen.include_goodput_auto:
        models = OnlineModels(
            chosen.goodput, scenario.block_size, table, scenario.cost.engine_multiple
        )
        one = GoodputChooser(
            chosen.goodput, table, scenario.block_size, scenario.seed, min_k, True, models
        )
        out.append(GoodputAutoChooser(chosen.goodput, one, allocator(models=models)))
    if chosen.include_bayes_bound:
        if auc is None:
            raise ValueError("policies.include_bayes_bound needs acceptance.confidence_auc")
        bound = functools.partial(
            ExactPosteriorChooser, chosen.goodput, table, cost, scenario.block_size
        )
        # joint and prefix reads, under the policy file's bounds and under vLLM's (k from 1)
        for joint in (True, False):
            out.extend(bound(low, auc, scenario.seed, joint) for low in dict.fromkeys((min_k, 1)))
        tasks = scenario.acceptance.parametric
        medians = {
            task: parametric_rates(model, scenario.block_size) for task, model in tasks.items()
        }
        out.append(bound(min_k, auc, scenario.seed, False, medians))
    if chosen.include_vllm_av:
        out.append(
            VllmAvRaggedChooser(
                chosen.goodput, table, cost, scenario.block_size, auc, scenario.seed
            )
        )
    return out
