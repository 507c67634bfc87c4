"""The baselines as the embedded engine's step planners (engines/embedded/events.py).

- ``BaselinePlanner``: a ``policies.baselines`` ``StepPolicy``, one k for the step (padded);
- ``OraclePlanner``: the clairvoyant oracle with the step's draws read for all rows at once;
- ``RowAllocationPlanner`` (ragged engine): a two-phase ``SlotPlanner`` whose rows draft all
  they may and verify what a per-row rule (vLLM's ``decide_rows``) allocates from their draft
  confidence;
- ``DeviceRowAllocationPlanner`` (ragged engine): the same, allocated on the device as vLLM
  does (``DeviceSlotPlanner``: the budget from each row's confidence of its previous step, the
  allocation from the fresh one, no host sync between draft and verify);
- ``RunOraclePlanner`` (ragged engine): each row verifies exactly its drawn run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from engines.embedded.events import RequestView, SpecController, StepReport
from engines.embedded.synthetic import SyntheticAcceptance
from policies.baselines.base import StepPolicy
from policies.baselines.oracle import ClairvoyantOracle
from policies.slot_allocator import RaggedChoice
from policies.slot_scoring import SlotScoring, scoring_for
from policies.types import PositionValues, StepCost, StepRow, Task

RowRule = Callable[[Sequence[StepRow], int], RaggedChoice]  # rows, batch size -> k per row


class RowPlanner:
    """What every planner here shares: each request's ``StepRow``, host time and calls; the
    rows learn from their own histories, so ``record`` and ``prepare`` do nothing."""

    def __init__(self) -> None:
        self._rows: dict[str, StepRow] = {}
        self.host_s = 0.0
        self.calls = 0

    def record(self, controllers: Sequence[SpecController], reports: Sequence[StepReport]) -> None:
        return None  # baselines learn from the rows' histories when they decide

    def prepare(self, views: Sequence[RequestView], controllers: Sequence[SpecController]) -> None:
        return None  # nothing to prepare ahead: plan() decides on the step's own rows

    def _row(self, view: RequestView) -> StepRow:
        """A request's row, reused while its ceiling holds (its lists grow in place) and it is
        the same request: a later run's request of the same id (``--warm-policies`` keeps
        the planner across runs of one trace) has lists of its own. (Until session 19 the
        row was matched on the id alone, so a warm planner's second and later runs read the
        first run's finished histories: no outcome of theirs reached vLLM's estimators.)"""
        row = self._rows.get(view.request_id)
        if (
            row is None
            or row.max_spec_tokens != view.max_spec_tokens
            or row.accept_lengths is not view.accept_lengths
        ):
            if len(self._rows) > 4096:  # finished requests' rows: drop them all now and then
                self._rows.clear()
            row = self._rows[view.request_id] = StepRow(
                view.request_id,
                Task(view.context["task"]),
                view.accept_lengths,
                view.spec_tokens,
                view.max_spec_tokens,
            )
        return row


class BaselinePlanner(RowPlanner):
    """A policies.baselines ``StepPolicy`` as the engine's step planner: one k for the step."""

    def __init__(self, policy: StepPolicy) -> None:
        super().__init__()
        self.policy = policy

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        started = time.perf_counter()
        rows = [self._row(view) for view in views]
        k = self.policy.decide_step(rows, len(views)).spec_tokens
        self.host_s += time.perf_counter() - started
        self.calls += 1
        return [k] * len(views)


class OraclePlanner(BaselinePlanner):
    """The oracle with the step's draws read for all rows in one vectorised call (a per-row
    draw costs ~10 us: 0.6 ms a step at batch 64, which would be charged to the oracle)."""

    def __init__(
        self, synthetic: SyntheticAcceptance, cost: StepCost, block_max: int, min_k: int
    ) -> None:
        self._synthetic = synthetic
        self._runs: dict[str, int] = {}
        self._k_max = block_max
        super().__init__(ClairvoyantOracle(cost, block_max, min_k, self._lookahead))

    def _lookahead(self, row: StepRow, k_max: int) -> int:
        return min(self._runs[str(row.row_id)], k_max)

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        started = time.perf_counter()
        runs = drawn_runs(self._synthetic, views, self._k_max)
        self._runs = {v.request_id: run for v, run in zip(views, runs, strict=True)}
        self.host_s += time.perf_counter() - started
        return super().plan(views, controllers)


class RunOraclePlanner(RowPlanner):
    """Ragged engine: every row verifies exactly the drafts it will accept this step,
    ``min(run, k_max)`` (the per-row clairvoyant choice: no rejected draft is ever verified,
    no acceptable one left out; not a throughput bound, since it ignores what a row's width
    costs the step)."""

    def __init__(self, synthetic: SyntheticAcceptance, block_max: int) -> None:
        super().__init__()
        self._synthetic = synthetic
        self._k_max = block_max

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        started = time.perf_counter()
        runs = drawn_runs(self._synthetic, views, self._k_max)
        ks = [min(run, view.max_spec_tokens) for run, view in zip(runs, views, strict=True)]
        self.host_s += time.perf_counter() - started
        self.calls += 1
        return ks


class RowAllocationPlanner(RowPlanner):
    """Ragged engine, two-phase steps: ``plan`` drafts every row at its maximum, ``allocate``
    gives each row the k ``rule`` picks from the rows (their draft confidence included)."""

    def __init__(self, rule: RowRule) -> None:
        super().__init__()
        self._rule = rule

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        self.calls += 1
        return [view.max_spec_tokens for view in views]

    def allocates(self) -> bool:
        return True

    def allocate(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        confidence: Sequence[PositionValues],
    ) -> list[int]:
        started = time.perf_counter()
        rows = [
            self._row(view)._replace(draft_confidence=values)
            for view, values in zip(views, confidence, strict=True)
        ]
        ks = self._rule(rows, len(views)).spec_tokens
        self.host_s += time.perf_counter() - started
        return ks


DeviceRule = Callable[[Sequence[StepRow], int], tuple[RaggedChoice, SlotScoring]]
Observed = Callable[[SlotScoring, Sequence[PositionValues], Sequence[int], Sequence[int]], None]


class DeviceRowAllocationPlanner(RowAllocationPlanner):
    """``RowAllocationPlanner`` allocated on the device, as vLLM's adaptive verification runs:
    ``scoring_rule`` (``device_scoring``) prices a step from each row's confidence of an
    earlier step and hands the device its estimator; ``observed`` learns from each step that
    ran. The scoring of the next step is made while this one runs (``prepare``, in the
    engine's overlap: the rows' confidence then is one step older, as vLLM's budget reads
    confidences copied to the host asynchronously), so between draft and verify the host only
    copies tables and replays; a step whose rows are not among those it was made for (a new
    request) is scored then, and so is a drafting burst whose scoring made ahead read
    confidence more than one step older than the freshest (the engine's bursts: the same rule
    as goodput's controller, so both rules get the same freshness). ``allocate`` (the host
    path) stays for engines that ask."""

    def __init__(self, rule: RowRule, scoring_rule: DeviceRule, observed: Observed) -> None:
        super().__init__(rule)
        self._scoring_rule = scoring_rule
        self._observed = observed
        # request id -> (its history list, its last step's confidence)
        self._confidence: dict[str, tuple[object, PositionValues]] = {}
        # The next step's scoring, made while this one ran: (row id -> its row there, scoring,
        # the steps told by then).
        self._ahead: tuple[dict[str, int], SlotScoring, int] | None = None
        self._told = 0  # device-allocated steps told so far
        self._running: SlotScoring | None = None  # the scoring of the step on the device
        self.scored_ahead = 0  # steps that used a scoring made ahead
        self.scored_late = 0  # steps scored between draft and verify

    def _last_confidence(self, view: RequestView, history: object) -> PositionValues | None:
        """The request's confidence of its previous step, if it covers what the row may
        verify now (a request of the same id from an earlier run has another history)."""
        last = self._confidence.get(view.request_id)
        if last is None or last[0] is not history or len(last[1]) < view.max_spec_tokens:
            return None
        return last[1]

    def _score(self, views: Sequence[RequestView]) -> SlotScoring:
        rows = [self._row(view) for view in views]
        rows = [
            row._replace(draft_confidence=self._last_confidence(view, row.accept_lengths))
            for view, row in zip(views, rows, strict=True)
        ]
        return self._scoring_rule(rows, len(views))[1]

    def prepare(self, views: Sequence[RequestView], controllers: Sequence[SpecController]) -> None:
        started = time.perf_counter()
        self._ahead = None
        if views:
            index = {view.request_id: i for i, view in enumerate(views)}
            self._ahead = (index, self._score(views), self._told)
        self.host_s += time.perf_counter() - started

    def allocates_on_device(self) -> bool:
        return True

    def slot_scoring(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        drafted: Sequence[int],
    ) -> SlotScoring:
        started = time.perf_counter()
        self._running = None
        scoring = self._from_ahead(views)
        if scoring is None:
            scoring = self._score(views)
            self.scored_late += 1
        else:
            self.scored_ahead += 1
        self._running = scoring
        self.host_s += time.perf_counter() - started
        return scoring

    def _from_ahead(self, views: Sequence[RequestView]) -> SlotScoring | None:
        ahead, self._ahead = self._ahead, None
        if ahead is None or self._told - ahead[2] > 1:  # (a burst's scores came since)
            return None
        return scoring_for(ahead[1], ahead[0], [view.request_id for view in views])

    def scored_on_device(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        confidence: Sequence[PositionValues],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
    ) -> None:
        started = time.perf_counter()
        self._told += 1
        if len(self._confidence) > 4096:  # finished requests': drop them all now and then
            self._confidence.clear()
        for view, values in zip(views, confidence, strict=True):
            self._confidence[view.request_id] = (view.accept_lengths, values)
        running = self._running  # kept: a drafting burst's steps share one scoring
        if running is not None:
            self._observed(running, confidence, spec_tokens, accept_lengths)
        self.host_s += time.perf_counter() - started


def drawn_runs(
    synthetic: SyntheticAcceptance, views: Sequence[RequestView], k_max: int
) -> list[int]:
    """Each row's drawn run at its coming step (what the runner will draw), one call."""
    identities = [synthetic.identity(v.request_id, v.context) for v in views]
    runs = synthetic.accept_runs(
        [task for task, _ in identities],
        [key for _, key in identities],
        [v.step_index for v in views],
        k_max,
    )
    return [int(r) for r in runs]
