"""Per-step k for the embedded engine: one ``StepController`` per engine instance.

It is the engine's ``StepPlanner``: before each step the engine calls ``plan`` once with every
running row. ``StepController.start`` makes a request's own ``SpecController``
(``RequestSteps``) when the request arrives, on the caller's thread; it reads the running
policy and the acceptance estimates once then, through the ``StepPolicySource`` the engine's
owner passes in (the daemon: its policy store, windowed statistics and metrics; the GPU
benchmark: a fixed policy and its own online models). Nothing here imports the daemon.

Two ways to decide:

- the policy has online models (goodput): the engine verifies every row of a step at the
  widest row's width and drafts for every row once any row drafts, so one k per step is chosen
  for the whole batch by ``policies.batch_width.BatchWidth`` (held here, rebuilt when a newer
  policy version arrives) from exactly the rows of this step, each with the k its past steps
  actually ran. ``shared_width=False`` asks the policy per request instead (a benchmark arm:
  what a per-request policy would do on a padded engine);
- any other policy: asked per request per step, except that the first step runs the k the
  gateway already chose (and told the client).

A policy that raises gives k = 0 for that step and is reported to the source (counted).
Randomness comes from the ``random.Random`` passed in; policies stay pure.

Host time. On a GPU ``record`` and ``prepare`` run while the device computes the step, so they
cost nothing while the step is longer than they are. A small target's step is a few ms and
host-bound: there every microsecond of the controller is step time. So while a batch keeps
the same rows, or nearly the same number of rows of each task (a request that ended replaced
by one of its task; at 8 rows or more, at most one row in 8 changed: ``_similar``), the shared
k is re-decided only every ``cadence`` steps (the recorded steps are kept aside and folded into
the online models just before the next decision): as few decisions as keep the controller's
measured host time under ``host_budget`` of the measured step time, and at least one every
``max_replan_steps`` (the policy's goodput settings). A batch whose size or task mix moved
further, a newer policy version, or a decision that was a probe (one step only) is decided
afresh at once.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engines.embedded.events import RequestView, SpecController, StepReport
from policies.baselines.ragged_cost import TableRaggedCost
from policies.batch_width import BatchWidth, describe
from policies.costmodel import CostTable, padded_width
from policies.model import PolicySpec
from policies.observation import step_observation
from policies.online import OnlineModels
from policies.slot_allocator import AllocatorSettings, PreparedStep, SlotAllocator
from policies.slot_scoring import SlotScoring, scoring_for
from policies.step_mode import BucketView, ModeSettings, StepModeChooser
from policies.types import (
    TASK_INDEX,
    TASKS,
    Policy,
    PositionValues,
    StepRow,
    Task,
    max_spec_tokens,
)

log = logging.getLogger(__name__)

# A prepared decision is used when at least this share of the step's rows were among the rows
# it was made for: a batch that changed more (a new request at batch 1, say) is decided afresh.
_REUSE_SHARE = 0.75
# A held decision serves a batch whose rows per task moved by at most one in this many rows.
_MIX_SLACK = 8
# Weight of each new measurement in the running means of decision host time and step time.
_HOST_EMA = 0.1
# The auto step mode times an engine call by the wall clock unless it took more than three
# times its steps' reported time and this much (then the engine had waited for work).
MODE_IDLE_S = 0.05


def held_calls(spec_tokens: int, before: tuple[int, int] | None, cadence: int, ramp: bool) -> int:
    """Calls a shared decision of ``spec_tokens`` serves, ``before`` the one it replaces
    (its k and calls; None: none): the cadence, but with ``ramp`` (``ramp_drafting_holds``) a
    switch to drafting serves 1 call and each drafting decision after it twice as many as the
    last, up to the cadence. (A probe serves 1: the caller's.)"""
    if spec_tokens <= 0 or not ramp:
        return cadence
    if before is None or before[0] <= 0:
        return 1  # drafting turned on: read its first steps at the next call
    return min(cadence, 2 * before[1])


@dataclass
class _Held:
    """The shared k last decided, kept for the following steps of the same rows or of rows of
    a similar task mix (``_similar``: a request that ended replaced by one of its task, say)."""

    spec_tokens: int
    row_ids: frozenset[str]
    mix: tuple[int, ...]  # rows per task (``_mix``)
    version: int
    serves: int  # steps it may serve: 1 for a probe, else the cadence when it was made
    age: int = 1  # steps it has served


@dataclass
class _Pending:
    """Steps recorded since the last fold into the online models (see the module docstring)."""

    rows: dict[tuple[int, Task], tuple[OnlineModels, list[int], list[int]]] = field(
        default_factory=dict
    )
    # per policy's models (by id): (models, [(batch size, width, drafting, seconds), ...])
    times: dict[int, tuple[OnlineModels, list[tuple[int, float, float, float]]]] = field(
        default_factory=dict
    )
    steps: int = 0


@dataclass
class _Rows:
    """What one batch's controllers imply, kept while the batch keeps them (``_rows``):
    ``plan``, ``prepare`` and ``record`` each ask every step, and a batch keeps its rows for
    many steps. It holds the controllers, so an id it compares cannot be a new object's."""

    controllers: list[SpecController]
    ids: list[int]  # the controllers' ids, in row order
    shared: list[int]  # rows the batch planner decides together
    alone: list[int]  # rows asked one by one
    newest: ActivePolicy | None  # the newest policy among the shared rows
    # per group (a policy's models and a task) of the rows: its rows, its first row's policy
    groups: dict[tuple[int, Task], tuple[int, ActivePolicy]]
    request_ids: frozenset[str] | None = None  # the shared rows' (``prepare``'s, once)


class ActivePolicy(Protocol):
    """The running policy as the step controller needs it (the daemon's ``RunningPolicy``)."""

    @property
    def version(self) -> int: ...

    @property
    def spec(self) -> PolicySpec: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def models(self) -> OnlineModels | None: ...


class StepPolicySource(Protocol):
    """What the engine's owner supplies to choose k per step."""

    def active(self) -> ActivePolicy:
        """The policy running now (read once per request, when it starts)."""
        ...

    def acceptance(self, task: Task) -> Mapping[str, Any]:
        """Observation fields for ``task`` when the policy has no online models:
        ``accept_rates`` and ``accept_trials`` (windowed statistics)."""
        ...

    def policy_failed(self) -> None:
        """A decision raised; the step ran with k = 0 (count it)."""
        ...


@dataclass
class RequestSteps:
    """One request's spec controller: called by the engine before each of its steps."""

    controller: StepController
    task: Task
    confidence: float
    first_spec_tokens: int
    active: ActivePolicy
    learned: Mapping[str, Any]  # observation fields captured when the request started
    row: StepRow | None = field(default=None, repr=False)  # its batch-planner row, reused
    # Its draft confidence of its last device-allocated step (every drafted position): what
    # the next such step's budget is priced on (``StepController.slot_scoring``).
    last_confidence: PositionValues | None = field(default=None, repr=False)
    # (id of its policy's online models, task): the group its steps are recorded in; None when
    # the policy has no online models (then it is asked alone). Fixed for the request's life.
    group: tuple[int, Task] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        models = self.active.models
        self.group = None if models is None else (id(models), self.task)

    def __call__(self, view: RequestView) -> int:
        """Asked alone (an engine without a planner, or a per-request policy)."""
        return self.controller.guarded(self._decide, view)

    def _decide(self, view: RequestView) -> int:
        if view.step_index == 0 and self.active.models is None:
            return self.first_spec_tokens  # the gateway's decision, as told to the client
        return self.controller.per_request(self, view)

    def step_row(self, view: RequestView) -> StepRow:
        """The batch planner's row for this request (its lists grow in place: reused)."""
        row = self.row
        if row is None or row.max_spec_tokens != view.max_spec_tokens:
            row = self.row = StepRow(
                view.request_id,
                self.task,
                view.accept_lengths,
                view.spec_tokens,
                view.max_spec_tokens,
            )
        return row


class StepController:
    """Chooses k for every row of every step of one engine (see the module docstring)."""

    def __init__(
        self,
        source: StepPolicySource,
        block_size: int,
        rng: random.Random | None = None,
        window_steps: int = 32,
        shared_width: bool = True,
        clock: Callable[[], float] = time.monotonic,
        ragged: bool = False,
    ) -> None:
        self._source = source
        self.block_size = block_size
        # The engine's rows verify at their own widths (ragged CUDA-graph verifies or the eager
        # packed path; the embedded backend sets it once the engine is loaded, before it offers
        # its cost table): goodput's ``step_mode: engine`` (the default) then runs ``auto``,
        # else ``shared``, and the engine's table prices every k on its own (no padded widths).
        self.ragged = ragged
        self._rng = rng or random.Random()
        self._window = window_steps
        self._shared_width = shared_width
        self._clock = clock
        # Guards the online models: decisions read them on the engine thread while ``record``
        # may update them on the caller's.
        self._lock = threading.Lock()
        self._width: BatchWidth | None = None
        # The next step's shared k, prepared while the device ran the last one: (k, the rows
        # it was decided for, their mix, policy version, ``_rows``'s answer then: the same
        # answer at ``plan`` means the same rows).
        self._prepared: tuple[int, frozenset[str], tuple[int, ...], int, _Rows | None] | None = None
        self._width_key: tuple[int, int] = (-1, -1)  # (policy version, block size) it serves
        self.host_s = 0.0  # time spent planning and recording steps, for benchmarks
        self.calls = 0
        # This engine's own step costs (its start-up profile): the running policy prices steps
        # with them when it has online models and no cost table of its own.
        self.cost_table: CostTable | None = None
        # Why the latest k: the batch planner's last decision for a step with a row that could
        # draft a whole block (formatted only when read), or the per-request policy's last one.
        self._batch_decision: tuple[str, int, int, float] | None = None
        self._request_reason = ""
        self._reason_memo: tuple[tuple[str, int, int, float] | None, str] = (None, "")
        # Two-phase steps (goodput ``step_mode: slots``): the policy and the rows the step just
        # planned will allocate after drafting, and the allocator of that policy version.
        self._slots: tuple[ActivePolicy, list[int]] | None = None
        # The coming allocation's confidence-free part: (policy version, rows, step).
        self._allocation: tuple[int, tuple[int, ...], PreparedStep] | None = None
        self._allocator: tuple[int, SlotAllocator] | None = None
        self._on_device = False  # the two-phase step just planned allocates on the device
        # Device allocation: the next step's scoring made while this one runs (policy
        # version, row id -> its row, scoring, the device-allocated steps told by then), and
        # the scoring of the step (or drafting burst) on the device.
        self._ahead: tuple[int, dict[str, int], SlotScoring, int] | None = None
        self._running: SlotScoring | None = None
        self._scores_told = 0  # device-allocated steps whose scores came back so far
        self.scored_ahead = 0  # device-allocated steps scored while the previous step ran
        self.scored_late = 0  # ... and scored between their draft and verify
        # Auto step mode: which mode pays per batch-size bucket, measured on this engine.
        self._modes: StepModeChooser | None = None
        self._modes_spec: object = None  # the goodput settings ``_modes`` was built for
        # The auto mode's steps of the last engine call, timed at the next ``plan`` by the
        # wall time between the two calls and told to its chooser (``_tell_modes``): (chooser,
        # rows, two-phase, tokens emitted, the step's reported seconds). Only steps of batch
        # sizes the chooser is asked about (``slots_min_batch`` rows or more) are kept.
        self._mode_steps: list[tuple[StepModeChooser, int, bool, int, float]] = []
        # A step of the last engine call set something up on first use (its reports'
        # ``first_use``): that call's steps are not told to the chooser. Session 52's compiled
        # 8B warm pass: the first device-allocated burst's steps took 109 ms each against
        # ~19, and a chooser told them decided its 64-row bucket on them.
        self._mode_call_set_up = False
        self._call_started_s: float | None = None  # the ``_clock`` at the last ``plan``
        # The admissions' prefill the engine ran since then (``prefill_time``): no step
        # mode's cost, taken out of the wall time the last call's steps are timed by.
        self._prefill_s = 0.0
        # Where the engine calls ``prepare`` behind each step (its overlap), ``plan`` only
        # takes the clock and the steps (due: the clock then, the previous call's clock, the
        # steps) and ``prepare`` tells the chooser, off the critical path between two steps.
        self._modes_due: (
            tuple[float, float | None, list[tuple[StepModeChooser, int, bool, int, float]]] | None
        ) = None
        self._prepares = False  # ``prepare`` has been called (an engine that overlaps)
        # Every auto-mode step as its chooser was told it (rows, two-phase, tokens, ms), kept
        # while a caller sets a list here (the GPU-decisions harness, per phase); None: off.
        self.mode_told: list[tuple[int, bool, int, float]] | None = None
        # The engine's last decode call, its wall time over its steps (``call_time``): what
        # its steps, recorded while the next call runs, are priced at in the cost model.
        self._call_step_s = 0.0
        # Decision cadence (module docstring): the decision kept for the same rows, the steps
        # not yet folded, and running means of a decision's host time and of the step time.
        self._held: _Held | None = None
        self._pending = _Pending()
        self._decision_s: float | None = None
        self._step_s: float | None = None
        self.decisions = 0  # shared-k decisions made (the rest reused a held one)
        self._rows_memo: _Rows | None = None  # ``_rows``'s last answer

    @property
    def batch_width(self) -> BatchWidth | None:
        return self._width

    def calibrations(self) -> dict[str, float]:
        """Per task, the shared decisions' factor on its drafted expectations
        (``BatchWidth.calibrations``: 1 unless ``shared_calibration``); empty before the
        first shared decision."""
        width = self._width
        if width is None:
            return {}
        return {
            task.value: float(factor)
            for task, factor in zip(TASKS, width.calibrations, strict=True)
        }

    def models(self) -> OnlineModels | None:
        """The running policy's online models (acceptance and step cost), if it has any."""
        return self._source.active().models

    def offer_cost_table(self, table: CostTable) -> None:
        """This engine's measured step costs: the running policy (and every later version)
        prices steps with them unless it has a cost table of its own."""
        self.cost_table = table
        self._adopt_cost_table(self._source.active())

    def _adopt_cost_table(self, active: ActivePolicy) -> None:
        models = active.models
        if models is not None and models.cost is None and self.cost_table is not None:
            # A ragged engine verifies each row's own k + 1 tokens: every k has its price.
            multiple = 1 if self.ragged else None
            with self._lock:
                if models.adopt_cost_table(self.cost_table, multiple):
                    log.info(
                        "policy version %d prices steps with this engine's profile%s",
                        active.version,
                        " (per-row widths: every k priced)" if self.ragged else "",
                    )

    def start(self, task: Task, confidence: float, first_spec_tokens: int) -> RequestSteps:
        """The spec controller of a request that starts now (call on the caller's thread)."""
        active = self._source.active()
        self._adopt_cost_table(active)
        models = active.models
        learned = models.observe(task) if models is not None else self._source.acceptance(task)
        return RequestSteps(self, task, confidence, first_spec_tokens, active, learned)

    def record(self, controllers: Sequence[SpecController], reports: Sequence[StepReport]) -> None:
        """What a step did, into the online models of the rows' policies: each row's
        acceptance at the k it ran, and the step's time at its padded width (every row of a
        step verifies the widest row's width; drafting runs for all once any row drafts)."""
        started = time.perf_counter()
        try:
            self._record(controllers, reports)
        finally:
            self.host_s += time.perf_counter() - started

    def _record(self, controllers: Sequence[SpecController], reports: Sequence[StepReport]) -> None:
        pending = self._pending
        groups = pending.rows
        seen: dict[tuple[int, Task], ActivePolicy] = {}  # this step's groups (one policy each)
        if len(controllers) != len(reports):
            raise ValueError(f"{len(controllers)} controllers for {len(reports)} reports")
        shared = len(reports) > 1 and len(set(map(id, reports))) == 1
        if shared:
            # A plain step's one report shared by every row (``_plain_report``): its
            # outcome once per group, not per row (this runs behind every plain step).
            report = reports[0]
            for group, (count, active) in self._rows(controllers).groups.items():
                entry = groups.get(group)
                if entry is None:
                    models = active.models
                    assert models is not None, "a group is set only for a policy with models"
                    entry = groups[group] = (models, [], [])
                seen[group] = active
                entry[1].extend([report.spec_tokens] * count)
                entry[2].extend([report.accept_length] * count)
        else:
            for steps, report in zip(controllers, reports, strict=True):
                if not isinstance(steps, RequestSteps) or steps.group is None:
                    continue
                group = steps.group
                entry = groups.get(group)
                if entry is None:
                    models = steps.active.models
                    assert models is not None, "a group is set only for a policy with models"
                    entry = groups[group] = (models, [], [])
                    seen[group] = steps.active
                elif group not in seen:
                    seen[group] = steps.active
                entry[1].append(report.spec_tokens)
                entry[2].append(report.accept_length)
        newest = max(seen.values(), key=_version) if seen else None
        if newest is not None and newest.models is not None and reports:
            first = reports[0]
            widest = first.spec_tokens if shared else max(r.spec_tokens for r in reports)
            two_phase = first.two_phase  # every row drafted
            multiple = (newest.models.cost or newest.models.spec).verify_width_multiple
            if two_phase or multiple == 1:  # each row verified its own k + 1
                width = (
                    float(first.spec_tokens + 1)
                    if shared
                    else sum(report.spec_tokens + 1 for report in reports) / len(reports)
                )
            else:
                width = float(padded_width(widest, multiple))
            drafting = 1.0 if two_phase else float(widest > 0)
            seconds = reports[0].step_time_s
            # the cost model learns what a step cost the engine: the call's wall time per
            # step where longer than the runner's time (the host work of a call that the
            # device's work did not hide: on the real pair, H100 call s42d, ~0.7-1 ms a
            # drafting 64-row step and ~0.2 ms a plain one in bursts, so the runner's times
            # priced drafting ~20% low against plain and goodput drafted wide where
            # no-spec was the fastest policy)
            priced = max(seconds, self._call_step_s)
            if (
                self._times_mode_step(drafting > 0)
                and self.step_mode(newest) == "auto"
                and _two_phase(newest, reports[0].batch_size)
            ):  # a drafting step of a bucket the chooser is asked about
                self._record_mode(newest, reports)
            models = newest.models
            _, times = pending.times.setdefault(id(models), (models, []))
            times.append((reports[0].batch_size, width, drafting, priced))
            if seconds > 0:
                self._step_s = _ema(self._step_s, seconds)
        pending.steps += 1
        # Folded by the next decision, which comes within ``serves`` steps while the rows
        # stay; sooner when decisions are not being spaced (or none are made).
        held = self._held
        if held is None or held.serves == 1 or pending.steps >= 2 * held.serves:
            self._fold()

    def _fold(self) -> None:
        """The steps recorded since the last fold, into their policies' online models. (The
        engine calls ``record``, ``plan`` and ``prepare`` on its own thread, so the pending
        steps need no lock; the models do, as ``start`` reads them on callers' threads.)"""
        pending, self._pending = self._pending, _Pending()
        if not pending.steps:
            return
        with self._lock:
            for (_, task), (models, ks, lengths) in pending.rows.items():
                models.record_steps(task, ks, lengths)
            for models, times in pending.times.values():
                models.record_step_times(times)

    def prefill_time(self, seconds: float) -> None:
        """The admissions' prefill the engine ran before the call it is about to plan
        (``TimesPrefills``): left out of the wall time that times the last call's steps for
        the auto mode's chooser (``_take_modes``)."""
        self._prefill_s += max(0.0, seconds)

    def call_time(self, seconds_per_step: float) -> None:
        """The engine's last decode call, its wall time over its steps (``TimesCalls``):
        told before that call's steps are recorded, and what the cost model prices them at
        where it exceeds the runner's time (``_record``)."""
        self._call_step_s = max(0.0, seconds_per_step)

    def cadence(self, active: ActivePolicy) -> int:
        """Steps one shared decision serves while its rows stay the same: the fewest decisions
        that keep their measured host time under ``host_budget`` of the step time, at most
        ``max_replan_steps`` apart (1 until both times are measured)."""
        models = active.models
        if models is None or self._decision_s is None or not self._step_s:
            return 1
        spec = models.spec
        wanted = math.ceil(self._decision_s / (spec.host_budget * self._step_s))
        return max(1, min(spec.max_replan_steps, wanted))

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        """k for every row of one engine step (the engine's ``StepPlanner``)."""
        started = time.perf_counter()
        self._take_modes(self._clock())
        ks = [0] * len(views)
        shared, newest = self._split(views, controllers, ks)
        self._slots, self._allocation = None, None
        self._on_device = False
        probe_k = None  # a two-phase step held one-phase while plain: the batch-wide k (0)
        if newest is not None and self._skips_probe(newest, len(shared)):
            probe_k = self._reuse_prepared(views, controllers, shared, newest)
            if probe_k is None:
                probe_k = self._decide_held(views, controllers, shared, newest)
        if probe_k == 0:  # (the chooser's schedule not advanced: its block waits)
            pass
        elif newest is not None and self._two_phase(newest, len(shared), decide=False):
            self._two_phase(newest, len(shared), decide=True)  # (the schedule advances)
            # Two-phase: every row drafts all it may; ``allocate`` picks what it verifies.
            hi = self._two_phase_bounds(newest)[1]
            for i in shared:
                ks[i] = min(hi, views[i].max_spec_tokens)
            self._slots = (newest, shared)
            # On the device when the policy asks, decides every row (else the host path
            # keeps the rows another policy decides apart) and the engine's rows verify at
            # their own widths (a padded engine would verify every drafted slot).
            device = newest.spec.goodput.slot_allocation == "device"
            self._on_device = device and len(shared) == len(views) and self.ragged
        elif newest is not None:
            k = self._reuse_prepared(views, controllers, shared, newest)
            if k is None:
                k = self._decide_held(views, controllers, shared, newest)
            for i in shared:
                ks[i] = k
            if self._times_mode_step(k > 0):  # a one-phase step the chooser counts: its
                self._two_phase(newest, len(shared), decide=True)  # schedule advances
        self.host_s += time.perf_counter() - started
        self.calls += 1
        return ks

    def _skips_probe(self, active: ActivePolicy, rows: int) -> bool:
        """Whether a two-phase step planned now waits on the batch-wide decision: the policy
        runs it plain while that decision is plain (k = 0), where drafting every row's block
        would buy nothing the shared k does not. In auto mode that holds for the chooser's
        measurements (a probe, or learning: ``mode_probe_when_plain`` off) and for the steps
        its two-phase incumbent runs (``mode_two_phase_when_plain`` off)."""
        goodput = active.spec.goodput
        if self.step_mode(active) != "auto" or not _two_phase(active, rows):
            return False
        chooser = self._mode_chooser(active)
        if not chooser.peek(rows):
            return False
        if chooser.incumbent(rows) is True:  # the incumbent's own step, not a measurement
            return not goodput.mode_two_phase_when_plain
        return not goodput.mode_probe_when_plain

    def allocates(self) -> bool:
        """Whether the step just planned is two-phase (the engine then calls ``allocate``)."""
        return self._slots is not None

    def allocates_on_device(self) -> bool:
        """Whether that two-phase step allocates on the device (``slot_scoring``)."""
        return self._slots is not None and self._on_device

    def prepare_allocation(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> None:
        """The part of the coming ``allocate`` that needs no draft confidence (learning from
        the rows' last outcomes, priors, own-history offsets), run by the engine while the
        device drafts: only the rest then waits between draft and verify."""
        started = time.perf_counter()
        try:
            self._allocation = None
            slots = self._slots
            if slots is None:
                return
            newest, _ = slots
            shared, rows = self._allocation_rows(views, controllers)
            rates = self._rates(newest)

            def prepare() -> int:
                step = self._slot_allocator(newest).prepare_step(rows, len(views), rates)
                self._allocation = (newest.version, tuple(shared), step)
                return 1

            self.guarded(prepare)
        finally:
            self.host_s += time.perf_counter() - started

    def allocate(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        confidence: Sequence[PositionValues],
    ) -> list[int]:
        """k per row once the draft has run (``policies.slot_allocator``); rows the policy
        does not decide together keep what they drafted. Finishes the step
        ``prepare_allocation`` prepared for the same rows (else decides it whole)."""
        started = time.perf_counter()
        try:
            ks = [len(c) for c in confidence]
            slots = self._slots
            if slots is None:
                return ks
            newest, _ = slots
            prepared, self._allocation = self._allocation, None
            shared = self._shared_rows(controllers)
            allocator = self._slot_allocator(newest)

            def decide() -> int:
                if prepared is not None and prepared[:2] == (newest.version, tuple(shared)):
                    step = prepared[2]
                else:
                    _, rows = self._allocation_rows(views, controllers)
                    step = allocator.prepare_step(rows, len(views), self._rates(newest))
                choice = allocator.finish_step(step, [confidence[i] for i in shared])
                for i, k in zip(shared, choice.spec_tokens, strict=True):
                    ks[i] = k
                self._batch_decision = None
                self._request_reason = choice.reason
                return 1

            if not self.guarded(decide):  # the policy raised: drafting off for this step
                for i in shared:
                    ks[i] = 0
            return ks
        finally:
            self.host_s += time.perf_counter() - started

    def slot_scoring(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        drafted: Sequence[int],
    ) -> SlotScoring | None:
        """The engine's ``DeviceSlotPlanner`` (asked while the device drafts): for a two-phase
        step of a policy with ``slot_allocation: device`` whose rows the policy all decides
        together, the allocator's scoring for the device, its budget from each row's
        confidence of an earlier step (none yet: the prior and history alone). Made while the
        previous step ran when that step's rows were these or more (``prepare``) and it is one
        step stale at most, as vLLM's budget is; else now, on the freshest confidence (after a
        drafting burst the one made ahead read confidence a whole burst older: the engine asks
        once the draft is queued, so the host scores while the device drafts). None: the
        policy raised (the rows verify what they drafted)."""
        started = time.perf_counter()
        try:
            self._running = None  # (the last scoring's steps are told: this one's are next)
            slots = self._slots
            ahead, self._ahead = self._ahead, None
            if slots is None:
                return None
            newest, _ = slots
            if (
                ahead is not None
                and ahead[0] == newest.version
                and self._scores_told - ahead[3] <= 1
            ):
                scoring = scoring_for(ahead[2], ahead[1], [v.request_id for v in views])
                if scoring is not None:
                    self.scored_ahead += 1
                    self._running = scoring
                    return scoring
            made = self._device_scoring(newest, views, controllers)
            if made is None:
                return None
            self.scored_late += 1
            self._running = made
            return made
        finally:
            self.host_s += time.perf_counter() - started

    def _device_scoring(
        self,
        active: ActivePolicy,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
    ) -> SlotScoring | None:
        """The allocator's device scoring of these rows (all decided together, else None)."""
        shared, rows = self._allocation_rows(views, controllers)
        if not rows or len(shared) != len(views):
            return None
        allocator = self._slot_allocator(active)
        made: list[SlotScoring] = []

        def decide() -> int:
            last = [getattr(c, "last_confidence", None) for c in controllers]
            choice, scoring = allocator.device_scoring(rows, len(views), self._rates(active), last)
            made.append(scoring)
            self._batch_decision = None
            self._request_reason = choice.reason
            return 1

        return made[0] if self.guarded(decide) else None

    def scored_on_device(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        confidence: Sequence[PositionValues],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
    ) -> None:
        """After a device-allocated step: each row's fresh confidence (for its next budget),
        and the allocator learns from the step (``SlotAllocator.observed``)."""
        started = time.perf_counter()
        try:
            self._scores_told += 1
            for steps, values in zip(controllers, confidence, strict=True):
                if isinstance(steps, RequestSteps):
                    steps.last_confidence = values
            running = self._running  # kept: a drafting burst's steps share one scoring
            slots = self._slots
            if running is not None and slots is not None:
                allocator = self._slot_allocator(slots[0])
                allocator.observed(running, confidence, spec_tokens, accept_lengths)
        finally:
            self.host_s += time.perf_counter() - started

    @staticmethod
    def _shared_rows(controllers: Sequence[SpecController]) -> list[int]:
        return [
            i
            for i, steps in enumerate(controllers)
            if isinstance(steps, RequestSteps) and steps.active.models is not None
        ]

    def _allocation_rows(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> tuple[list[int], list[StepRow]]:
        shared = self._shared_rows(controllers)
        rows = [controllers[i].step_row(views[i]) for i in shared]  # type: ignore[attr-defined]
        return shared, rows

    def _rates(self, active: ActivePolicy) -> Callable[[Task], Sequence[float]]:
        observe = self._observe(active)

        def rates(task: Task) -> Sequence[float]:
            values: Sequence[float] = observe(task)["accept_rates"]
            return values

        return rates

    def _two_phase(self, active: ActivePolicy, rows: int, decide: bool) -> bool:
        """A step of ``rows`` rows the policy decides together is two-phase: slots mode at
        ``slots_min_batch`` rows or more; auto mode there when its chooser says so (``decide``
        advances the chooser's schedule: the step is being planned; else it only peeks)."""
        mode = self.step_mode(active)
        if mode == "shared" or not _two_phase(active, rows):
            return False
        if mode != "auto":
            return True
        chooser = self._mode_chooser(active)
        return chooser.decide(rows) if decide else chooser.peek(rows)

    def step_mode(self, active: ActivePolicy) -> str:
        """The goodput policy's step mode on this engine: its own, or for ``engine`` (the
        default) ``auto`` where rows verify at their own widths and ``shared`` where a step
        pads every row to the widest (two-phase steps could save nothing there)."""
        mode = active.spec.goodput.step_mode
        if mode == "engine":
            return "auto" if self.ragged else "shared"
        return mode

    def _mode_chooser(self, active: ActivePolicy) -> StepModeChooser:
        """One per engine (the modes' speeds are the engine's), rebuilt when its settings
        change."""
        g = active.spec.goodput
        if self._modes is not None and self._modes_spec is g:  # (asked every step)
            return self._modes
        settings = ModeSettings.of(g)
        if self._modes is None or self._modes.settings != settings:
            self._modes = StepModeChooser(settings)
        self._modes_spec = g
        return self._modes

    def step_modes(self) -> list[BucketView]:
        """Auto step mode, per batch-size bucket (``BucketView``: the mode run outside probes,
        None while learning; each mode's tok/s; the paired ratio the mode is chosen on);
        empty otherwise."""
        modes = self._modes
        return modes.buckets() if modes is not None else []

    def _times_mode_step(self, drafted: bool) -> bool:
        """Whether a step is timed into the auto mode's chooser and advances its schedule: a
        drafting one only. A plain step is neither mode's (the batch-wide decision held both
        off: ``_skips_probe``), a pair of a plain block and a drafting one compares the traffic
        that flipped the decision, not the modes, and a learning block of one phase that plain
        steps used up would leave the chooser with two-phase blocks only (session 56)."""
        return drafted

    def _record_mode(self, active: ActivePolicy, reports: Sequence[StepReport]) -> None:
        """A step of the auto mode, kept for its chooser until the next ``plan`` times the
        engine call it was part of (``_tell_modes``)."""
        report = reports[0]
        if report.first_use:  # this engine call's time holds a one-off set-up: told nothing
            self._mode_call_set_up = True
        tokens = sum(r.accept_length for r in reports)
        self._mode_steps.append(
            (
                self._mode_chooser(active),
                report.batch_size,
                report.two_phase,
                tokens,
                report.step_time_s,
            )
        )

    def _take_modes(self, now_s: float) -> None:
        """At ``plan``: the last engine call's auto-mode steps, timed to now
        (``_tell_modes``), told now, or, where the engine calls ``prepare`` behind its steps,
        kept for it (a due set ``prepare`` did not take is told first)."""
        self._tell_due_modes()
        steps, self._mode_steps = self._mode_steps, []
        started, self._call_started_s = self._call_started_s, now_s
        prefill, self._prefill_s = self._prefill_s, 0.0
        if started is not None:  # (this call's prefill ran after the last call's steps)
            started = min(now_s, started + prefill)
        if self._mode_call_set_up:  # (StepReport.first_use: not the modes' own cost)
            self._mode_call_set_up = False
            steps = []
        if not steps:
            return
        if self._prepares:
            self._modes_due = (now_s, started, steps)
        else:
            self._tell_modes(now_s, started, steps)

    def _tell_due_modes(self) -> None:
        due, self._modes_due = self._modes_due, None
        if due is not None:
            self._tell_modes(*due)

    def _tell_modes(
        self,
        now_s: float,
        started: float | None,
        steps: list[tuple[StepModeChooser, int, bool, int, float]],
    ) -> None:
        """The last engine call's auto-mode steps into their chooser, timed by the wall time
        from that call's ``plan`` to this one (a change of a bucket's mode is logged). The
        steps' reported times (the runner's, per step) leave out what the modes spend apart
        from them: the engine's own work each call (one call per step for a two-phase step
        allocated on the host, one per burst of up to ``spec_burst`` one-phase steps) and the
        admissions' prefill (spread over a burst), so a chooser fed them ran two-phase 64-row
        steps whose phase came out 2-5% below one-phase static k = 7 (session 36, the
        compiled 8B arm's call s36f; call s36a's chooser had kept one phase). The wall
        time counts only between ``reported`` and ``3 x reported + MODE_IDLE_S`` (below: a
        clock that is not the engine's; above: the engine waited for work), else the reported
        times are used; it is shared among the steps in proportion to their reported times.
        The admissions' prefill that ran between the two calls (told by ``prefill_time``) is
        left out: it runs whenever requests arrive, whatever the mode, and timed into the call
        before it, it made that call's steps look slower (on the real pair 4-11 ms a burst
        against ~1.1 ms a plain 64-row step; replayed, the pooled one-phase rate of calls
        s51d-s53c was 36-38k tokens a second with it, 43-47k without: bench/mode_replay.py)."""
        reported = sum(step[4] for step in steps)
        wall = now_s - started if started is not None else reported
        scale = wall / reported if reported < wall <= 3 * reported + MODE_IDLE_S else 1.0
        told = self.mode_told
        for chooser, rows, two_phase, tokens, seconds in steps:
            before = chooser.incumbent(rows)
            chooser.record(rows, two_phase, tokens, seconds * scale)
            if told is not None:
                told.append((rows, two_phase, tokens, round(1e3 * seconds * scale, 4)))
            if chooser.incumbent(rows) != before:
                log.info("%s", chooser.describe(rows))

    def _two_phase_bounds(self, active: ActivePolicy) -> tuple[int, int]:
        """The policy's k bounds for two-phase rows: what a row drafts is at most
        ``slots_draft_cap``, and so is all the allocator may give it."""
        lo, hi = active.spec.bounds_for(self.block_size)
        cap = active.spec.goodput.slots_draft_cap
        return lo, hi if cap is None else min(hi, cap)

    def _slot_allocator(self, active: ActivePolicy) -> SlotAllocator:
        """Rebuilt when a newer policy version arrives; prices steps with its cost model."""
        held = self._allocator
        if held is None or held[0] != active.version:
            models = active.models
            assert models is not None and models.cost is not None, "checked by _allocates"
            lo, hi = self._two_phase_bounds(active)
            settings = AllocatorSettings(max_spec_tokens=hi, min_spec_tokens=min(lo, hi))
            held = self._allocator = (
                active.version,
                SlotAllocator(settings, TableRaggedCost(models.cost)),
            )
        return held[1]

    def prepare(self, views: Sequence[RequestView], controllers: Sequence[SpecController]) -> None:
        """Decide the next step's shared k now, while the device runs this step, from this
        step's rows and what is known before its results (one step stale). ``plan`` uses it
        when most of the next step's rows were among these (else it decides afresh)."""
        started = time.perf_counter()
        self._prepares = True
        self._tell_due_modes()
        self._prepared = None
        self._ahead = None
        shared, newest = self._split(views, controllers, None)
        two_phase = newest is not None and self._two_phase(newest, len(shared), decide=False)
        # (a two-phase step the policy holds back while plain needs the batch-wide k decided,
        # too; decided first, so a step it turns plain is not scored for the device)
        gated = two_phase and newest is not None and self._skips_probe(newest, len(shared))
        if newest is not None and (not two_phase or gated):
            rows = self._rows_memo  # (``_split``'s, just above)
            assert rows is not None
            if rows.request_ids is None:  # (the same controllers: the same requests)
                rows.request_ids = frozenset(views[i].request_id for i in shared)
            ids = rows.request_ids
            held = self._held
            if held is not None and (held.age >= held.serves or held.version != newest.version):
                held = None  # expired: decide afresh
            if held is not None and held.row_ids == ids:
                mix, keep = held.mix, True  # the same rows: the mix it was decided for
            else:  # the rows changed (the loop over them only then)
                mix = _mix(controllers, shared)
                keep = held is not None and _similar(held.mix, mix)
            if held is not None and keep:
                held.age += 1
                k = held.spec_tokens
            else:
                k = self._decide_held(views, controllers, shared, newest, ids, mix)
            self._prepared = (k, ids, mix, newest.version, rows)
            two_phase = two_phase and k > 0
        if (
            two_phase
            and newest is not None
            and newest.spec.goodput.slot_allocation == "device"
            and self.ragged
            and len(shared) == len(views)
        ):  # the next step is two-phase on the device: score it now (``slot_scoring``)
            scoring = self._device_scoring(newest, views, controllers)
            if scoring is not None:
                index = {view.request_id: i for i, view in enumerate(views)}
                self._ahead = (newest.version, index, scoring, self._scores_told)
        self.host_s += time.perf_counter() - started

    def _split(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        ks: list[int] | None,
    ) -> tuple[list[int], ActivePolicy | None]:
        """Indices of the rows the batch planner decides together, and the newest policy
        among them; other rows are asked alone (into ``ks``) when ``ks`` is given."""
        if len(views) != len(controllers):
            raise ValueError(f"{len(views)} views for {len(controllers)} controllers")
        rows = self._rows(controllers)
        if ks is not None:
            for i in rows.alone:
                ks[i] = controllers[i](views[i])
        return rows.shared, rows.newest

    def _rows(self, controllers: Sequence[SpecController]) -> _Rows:
        """The batch's rows (``_Rows``), memoised on the controllers' identities."""
        ids = list(map(id, controllers))
        memo = self._rows_memo
        if memo is not None and memo.ids == ids:
            return memo
        shared: list[int] = []
        alone: list[int] = []
        actives: list[ActivePolicy] = []
        groups: dict[tuple[int, Task], tuple[int, ActivePolicy]] = {}
        for i, steps in enumerate(controllers):
            if isinstance(steps, RequestSteps) and steps.group is not None:
                count, active = groups.get(steps.group, (0, steps.active))
                groups[steps.group] = (count + 1, active)
                if self._shared_width:
                    shared.append(i)
                    actives.append(steps.active)
                    continue
            alone.append(i)
        newest = None
        if actives:
            first = actives[0]
            if all(active is first for active in actives):  # the usual: one policy version
                newest = first
            else:
                newest = max(actives, key=_version)
        memo = self._rows_memo = _Rows(list(controllers), ids, shared, alone, newest, groups)
        return memo

    def _reuse_prepared(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        shared: list[int],
        newest: ActivePolicy,
    ) -> int | None:
        """The prepared k, if it was decided for (mostly) these rows, or rows of the same task
        mix, under this policy."""
        prepared, self._prepared = self._prepared, None
        if prepared is None or prepared[3] != newest.version:
            return None
        k, ids, mix, _, rows = prepared
        if rows is self._rows_memo:  # the controllers of ``prepare``'s rows: the same rows
            return k
        known = sum(1 for i in shared if views[i].request_id in ids)
        if known >= _REUSE_SHARE * len(shared) or _similar(mix, _mix(controllers, shared)):
            return k
        return None

    def _decide_held(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        shared: list[int],
        newest: ActivePolicy,
        ids: frozenset[str] | None = None,
        mix: tuple[int, ...] | None = None,
    ) -> int:
        """A fresh shared decision from every step recorded so far, held for the next steps
        of the same rows (or the same task mix); its host time feeds the cadence."""
        started = time.perf_counter()
        self._fold()
        k = self._decide_shared(views, controllers, shared, newest)
        self.decisions += 1
        self._decision_s = _ema(self._decision_s, time.perf_counter() - started)
        width = self._width
        probe = width is not None and width.last[0] == "probe"
        if ids is None:
            ids = frozenset(views[i].request_id for i in shared)
        if mix is None:
            mix = _mix(controllers, shared)
        self._held = _Held(k, ids, mix, newest.version, self._serves(newest, k, probe))
        return k

    def _serves(self, active: ActivePolicy, spec_tokens: int, probe: bool) -> int:
        """Calls a fresh decision may serve (``held_calls``)."""
        if probe:
            return 1
        models = active.models
        ramp = models is not None and models.spec.ramp_drafting_holds
        held = self._held  # the decision before this one
        before = None if held is None else (held.spec_tokens, held.serves)
        return held_calls(spec_tokens, before, self.cadence(active), ramp)

    def _decide_shared(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        shared: list[int],
        newest: ActivePolicy,
    ) -> int:
        rows = [controllers[i].step_row(views[i]) for i in shared]  # type: ignore[attr-defined]

        def decide() -> int:
            width = self._batch_width(newest)
            remaining = [views[i].num_remaining for i in shared] if width.reads_rooms else None
            k = width.decide(rows, self._observe(newest), remaining)
            # Explain the decisions a whole block could follow: near its end a request drafts
            # less or not at all whatever the policy thinks of its task.
            full = max_spec_tokens(self.block_size)
            if any(row.max_spec_tokens >= full for row in rows):  # usually the first row
                self._batch_decision = width.last
            return k

        return self.guarded(decide)

    @property
    def last_reason(self) -> str:
        """Why the latest step's k (for the dashboard; read from any thread)."""
        decision = self._batch_decision
        if decision is None:
            return self._request_reason
        memo = self._reason_memo
        if memo[0] is not decision:  # (formatted once per decision: read after every call)
            memo = self._reason_memo = (decision, describe(decision))
        return memo[1]

    def guarded(self, decide: Callable[..., int], *args: Any) -> int:
        """``decide(*args)``, or k = 0 (reported to the source) if it raises."""
        try:
            return int(decide(*args))
        except Exception:
            log.exception("policy failed on a step; drafting off for this step")
            self._source.policy_failed()
            return 0

    def _observe(self, active: ActivePolicy) -> Callable[[Task], Mapping[str, Any]]:
        models = active.models
        assert models is not None, "shared widths need the policy's online models"

        def observe(task: Task) -> Mapping[str, Any]:
            with self._lock:
                return models.observe(task)

        return observe

    def _batch_width(self, active: ActivePolicy) -> BatchWidth:
        """Rebuilt when a newer policy version arrives (rows of older versions then join it)."""
        key = (active.version, self.block_size)
        if self._width is None or self._width_key[0] < key[0] or self._width_key[1] != key[1]:
            assert active.models is not None, "shared widths need the policy's online models"
            lo, hi = active.spec.bounds_for(self.block_size)
            self._width = BatchWidth(active.models.spec, self.block_size, lo, hi, self._rng.random)
            self._width_key = key
        return self._width

    def per_request(self, steps: RequestSteps, view: RequestView) -> int:
        """The policy asked for one request's next step, with its recent steps."""
        done = len(view.accept_lengths)
        # the request's last steps, with the k they ran: for goodput enough for its window
        # when every ``request_plain_entry_steps`` plain steps count as one of it
        spec = steps.active.spec
        plain = spec.goodput.request_plain_entry_steps if spec.kind == "goodput" else 1
        start = max(0, done - self._window * plain)
        observation = step_observation(
            task=steps.task,
            confidence=steps.confidence,
            batch_size=view.batch_size,
            bounds=steps.active.spec.bounds_for(self.block_size),
            block_size=self.block_size,
            learned=steps.learned,
            accept_lengths=view.accept_lengths[start:],
            spec_tokens=view.spec_tokens[start:done],
            step_index=view.step_index,
            now_s=self._clock(),
            rng_u=self._rng.random(),
        )
        decision = steps.active.policy.decide(observation)
        self._batch_decision, self._request_reason = None, decision.reason
        return decision.spec_tokens


@dataclass(frozen=True)
class _Fixed:
    version: int
    spec: PolicySpec
    policy: Policy
    models: OnlineModels | None


class FixedPolicySource:
    """A policy source for tools that run one policy for their whole life (benchmarks):
    the policy never changes, and without online models acceptance is unknown (empty)."""

    def __init__(self, spec: PolicySpec, policy: Policy, models: OnlineModels | None) -> None:
        self._active = _Fixed(1, spec, policy, models)
        self.failures = 0

    def active(self) -> ActivePolicy:
        return self._active

    def acceptance(self, task: Task) -> Mapping[str, Any]:
        return {"accept_rates": (), "accept_trials": ()}

    def policy_failed(self) -> None:
        self.failures += 1


def _version(active: ActivePolicy) -> int:
    return active.version


def _mix(controllers: Sequence[SpecController], shared: Sequence[int]) -> tuple[int, ...]:
    """Rows per task among the shared rows: what a shared decision depends on besides the
    rows' own histories, so a decision held for one batch fits a batch of the same mix."""
    counts = [0] * len(TASK_INDEX)
    for i in shared:
        steps = controllers[i]
        assert isinstance(steps, RequestSteps)  # a shared row is one (``_split``)
        counts[TASK_INDEX[steps.task]] += 1
    return tuple(counts)


def _similar(decided: tuple[int, ...], now: tuple[int, ...]) -> bool:
    """Whether a decision made for a batch of mix ``decided`` fits one of mix ``now``: at most
    one row in ``_MIX_SLACK`` of the decided batch added, removed or of another task. Below
    ``_MIX_SLACK`` rows never: there each row's own history weighs in the decision (a new
    request at batch 1 must not run the k its predecessor's acceptance earned). Compared with
    the mix the decision was made for, so drift over the steps it serves is bounded too."""
    if sum(decided) < _MIX_SLACK:
        return False
    added = sum(max(0, b - a) for a, b in zip(decided, now, strict=True))
    removed = sum(max(0, a - b) for a, b in zip(decided, now, strict=True))
    return max(added, removed) <= sum(decided) // _MIX_SLACK


def _ema(mean: float | None, value: float) -> float:
    return value if mean is None else mean + _HOST_EMA * (value - mean)


def _two_phase(active: ActivePolicy, rows: int) -> bool:
    """A step of ``rows`` rows that a goodput policy with a two-phase step mode (the caller
    checked it) decides together may be two-phase: the policy can price it (a cost model) and
    the batch has at least ``slots_min_batch`` rows; otherwise one shared k."""
    models = active.models
    return (
        models is not None
        and models.cost is not None
        and active.spec.kind == "goodput"
        and rows >= active.spec.goodput.slots_min_batch
    )
