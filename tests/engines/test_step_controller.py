"""StepController: the embedded engine's per-step k, one per engine, fed by a policy source."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from engines.embedded.events import RequestView, StepReport
from engines.step_controller import StepController
from policies.costmodel import CostTable
from policies.model import GoodputSpec, PolicySpec
from policies.online import OnlineModels
from policies.registry import build_policy
from policies.step_mode import ModeSettings, StepModeChooser
from policies.types import Decision, Observation, Policy, Task

TABLE = CostTable(
    batch_sizes=(1, 8, 64),
    tokens_per_request=(1, 8, 16),
    step_time_s=((5.5e-3, 6.0e-3, 6.5e-3), (5.8e-3, 7.4e-3, 9.2e-3), (7.8e-3, 26.8e-3, 39e-3)),
)
QUIET = GoodputSpec(probe_probability=0.0, request_probe_steps=0, warmup_steps=0)


@dataclass(frozen=True)
class Active:
    version: int
    spec: PolicySpec
    policy: Policy
    models: OnlineModels | None = None


class Source:
    """An in-memory policy source: a settable active policy, fixed windowed acceptance."""

    def __init__(self, active: Active) -> None:
        self.now = active
        self.failures = 0

    def active(self) -> Active:
        return self.now

    def acceptance(self, task: Task) -> Mapping[str, Any]:
        return {"accept_rates": (0.9,) * 15, "accept_trials": (100.0,) * 15}

    def policy_failed(self) -> None:
        self.failures += 1


def _static(version: int = 1) -> Active:
    spec = PolicySpec()
    return Active(version, spec, build_policy(spec))


def _goodput(version: int = 1) -> Active:
    spec = PolicySpec(kind="goodput", goodput=QUIET)
    models = OnlineModels(QUIET, block_size=16, cost_table=TABLE)
    return Active(version, spec, build_policy(spec), models)


def _view(
    rid: str, step: int, batch: int, history: list[int], ks: list[int] | None = None
) -> RequestView:
    ks = [15] * len(history) if ks is None else ks
    return RequestView(rid, step, history, batch, len(history), {}, ks, 15)


def test_first_step_runs_the_gateway_k_then_the_policy_per_step() -> None:
    controller = StepController(Source(_static()), 16, random.Random(0))
    steps = controller.start(Task.CHAT, 0.9, 4)
    assert steps(_view("r", 0, 1, [])) == 4
    assert steps(_view("r", 1, 2, [3], [4])) == 7  # chat, batch 2: band 1-8 -> k=7
    # chat above 64 in the batch: drafting off (asked through the planner: per request)
    assert controller.plan([_view("r", 2, 70, [3, 1], [4, 7])], [steps]) == [0]
    assert controller.calls == 1 and controller.host_s > 0


def test_the_policy_sees_the_requests_history_aligned_with_its_k() -> None:
    seen: list[Observation] = []

    class Recording:
        name = "recording"

        def decide(self, observation: Observation) -> Decision:
            seen.append(observation)
            return Decision(5, "r")

    source = Source(Active(1, PolicySpec(), Recording()))
    controller = StepController(source, 16, random.Random(0), window_steps=2)
    steps = controller.start(Task.MATH, 0.7, 9)
    history: list[int] = []
    ks: list[int] = []
    for i in range(4):
        ks.append(min(steps(_view("r", i, 3, history, ks)), 4 - i))  # the engine's clamp
        history.append(i + 2)
    last = seen[-1]
    assert ks == [4, 3, 2, 1]
    # the k each step actually ran, not the one the policy asked for
    assert last.request_accept_lengths == (3, 4) and last.request_spec_tokens == (3, 2)
    assert last.previous_spec_tokens == 2 and last.confidence == 0.7
    assert last.accept_rates == (0.9,) * 15 and last.concurrency == 3


def test_a_failing_policy_gives_k0_and_is_reported() -> None:
    class Broken:
        name = "broken"

        def decide(self, observation: Observation) -> Decision:
            raise ZeroDivisionError

    source = Source(Active(1, PolicySpec(), Broken()))
    steps = StepController(source, 16).start(Task.MATH, 1.0, 15)
    assert steps(_view("r", 1, 1, [2])) == 0
    assert source.failures == 1


def test_goodput_rows_of_one_step_share_k_from_the_engines_planner() -> None:
    source = Source(_goodput())
    controller = StepController(source, 16, random.Random(1))
    rows = [controller.start(task, 0.9, 15) for task in (Task.MATH, Task.CHAT, Task.CODE)]
    ks = controller.plan([_view(f"r{i}", 0, 3, []) for i in range(3)], rows)
    assert ks[0] > 0 and len(set(ks)) == 1  # one k for the padded batch
    assert controller.batch_width is not None and controller.batch_width.steps == 1
    # Another engine has a planner of its own (state lives in the controller, not a module).
    other = StepController(source, 16, random.Random(1))
    assert other.batch_width is None
    # per task, the planner's calibration factor (nothing drafted yet: 1; /metrics reads it)
    assert controller.calibrations() == {"math": 1.0, "code": 1.0, "chat": 1.0}
    assert other.calibrations() == {}


def test_a_draining_batch_is_planned_from_what_its_rows_may_still_emit() -> None:
    """``drain_makespan``: the rows' rooms (``RequestView.num_remaining``) reach the planner,
    which judges a draining batch's k by its longest row."""
    spec = QUIET.model_copy(update={"drain_makespan": True})
    models = OnlineModels(spec, block_size=16, cost_table=TABLE)
    goodput = PolicySpec(kind="goodput", goodput=spec)
    controller = StepController(
        Source(Active(1, goodput, build_policy(goodput), models)), 16, random.Random(1)
    )
    steps = [controller.start(Task.MATH, 0.9, 15) for _ in range(4)]

    def plan(rows: int) -> list[int]:
        views = [
            RequestView(f"r{i}", 0, [], rows, 0, {}, [], 15, num_remaining=40 * (i + 1))
            for i in range(rows)
        ]
        return controller.plan(views, steps[:rows])

    plan(4)
    plan(3)  # a row left ...
    width = controller.batch_width
    assert width is not None and width.reads_rooms and not width.draining
    ks = plan(2)  # ... and none joined since
    assert width.draining and width.last[0] == "drain" and ks[0] == ks[1] > 0


def test_goodput_planner_is_rebuilt_for_a_new_policy_version() -> None:
    source = Source(_goodput(version=1))
    controller = StepController(source, 16, random.Random(1))
    controller.plan([_view("a", 0, 1, [])], [controller.start(Task.MATH, 1.0, 7)])
    first = controller.batch_width
    assert first is not None
    source.now = _goodput(version=2)
    controller.plan([_view("b", 0, 1, [])], [controller.start(Task.MATH, 1.0, 7)])
    assert controller.batch_width is not first and controller.batch_width is not None


def test_goodput_learns_from_step_reports() -> None:
    source = Source(_goodput())
    controller = StepController(source, 16, random.Random(1), shared_width=False)
    chat = controller.start(Task.CHAT, 1.0, 7)
    assert chat(_view("a", 0, 8, [])) > 0  # chat at batch 8 with the prior: drafting pays
    models = source.now.models
    assert models is not None
    before = models.step_cost().step_time_s(8, 15)
    for _ in range(400):  # every chat draft is rejected at once, and steps take 50 ms
        controller.record([chat, lambda v: 0], [StepReport(15, 1, [False] * 15, 0.05, 8)] * 2)
    assert controller.start(Task.CHAT, 1.0, 7)(_view("b", 1, 8, [1])) == 0
    assert controller.start(Task.MATH, 1.0, 7)(_view("c", 0, 8, [])) == 15  # math unaffected
    assert models.step_cost().step_time_s(8, 15) > 2 * before  # the step time was learned


def test_goodput_planner_failure_is_k0_and_reported() -> None:
    active = _goodput()
    assert active.models is not None
    source = Source(active)
    controller = StepController(source, 16)
    steps = controller.start(Task.MATH, 1.0, 7)

    def broken(task: Task) -> dict[str, object]:
        raise RuntimeError("no estimates")

    active.models.observe = broken  # type: ignore[method-assign]
    assert controller.plan([_view("x", 0, 1, [])], [steps]) == [0]
    assert source.failures == 1


def test_rows_of_mixed_policies_decide_apart() -> None:
    """A request's own callable (a fixed k, say) is asked alone; goodput rows share one k."""
    controller = StepController(Source(_goodput()), 16, random.Random(1))
    goodput = controller.start(Task.MATH, 1.0, 7)
    ks = controller.plan([_view("a", 0, 2, []), _view("b", 0, 2, [])], [goodput, lambda v: 3])
    assert ks[1] == 3 and ks[0] > 0


def test_a_prepared_step_is_used_only_for_mostly_the_same_rows() -> None:
    controller = StepController(Source(_goodput()), 16, random.Random(1))
    rows = [controller.start(Task.MATH, 1.0, 7) for _ in range(4)]
    views = [_view(f"r{i}", 0, 4, []) for i in range(4)]
    controller.plan(views, rows)
    width = controller.batch_width
    assert width is not None
    controller.prepare(views, rows)  # while the step runs
    decided = width.steps
    # The same rows next step: the prepared decision is used (no second decision).
    controller.plan([_view(f"r{i}", 1, 4, [5]) for i in range(4)], rows)
    assert width.steps == decided
    # At batch 1, a new request after the last one finished: decided afresh (its own row).
    controller.prepare([_view("r0", 1, 1, [5])], rows[:1])
    decided = width.steps
    controller.plan([_view("new", 0, 1, [])], [controller.start(Task.CHAT, 1.0, 7)])
    assert width.steps == decided + 1


def test_the_reason_says_why_the_latest_k() -> None:
    """The dashboard's "why k": the batch planner's last decision for a step in which some row
    could draft a whole block, or a per-request policy's."""
    controller = StepController(Source(_goodput()), 16, random.Random(0))
    steps = controller.start(Task.MATH, 0.9, 15)
    near_end = RequestView("z", 9, [16] * 9, 1, 9, {}, [15] * 9, 2)  # three tokens left
    controller.plan([near_end], [steps])
    assert controller.last_reason == ""  # a request's tail does not explain its task's k
    [k] = controller.plan([_view("a", 3, 1, [16, 16, 16])], [steps])
    assert controller.last_reason.startswith(f"batch[best] B=1 k={k} ")
    assert controller.last_reason.endswith("x plain")
    static = StepController(Source(_static()), 16, random.Random(0))
    chat = static.start(Task.CHAT, 0.9, 4)
    chat(_view("r", 1, 2, [3], [4]))
    assert static.last_reason.startswith("static:")


def _slots(version: int = 1, min_batch: int = 1) -> Active:
    goodput = QUIET.model_copy(update={"step_mode": "slots", "slots_min_batch": min_batch})
    spec = PolicySpec(kind="goodput", goodput=goodput)
    models = OnlineModels(goodput, block_size=16, cost_table=TABLE)
    return Active(version, spec, build_policy(spec), models)


def test_slots_mode_drafts_every_row_whole_then_allocates_per_row_from_confidence() -> None:
    controller = StepController(Source(_slots()), 16, random.Random(0))
    a, b = controller.start(Task.MATH, 0.9, 7), controller.start(Task.MATH, 0.9, 7)
    views = [_view("a", 3, 2, [4, 4, 4]), _view("b", 3, 2, [4, 4, 4])]
    assert controller.plan(views, [a, b]) == [15, 15]  # what each row drafts
    assert controller.allocates()
    ks = controller.allocate(views, [a, b], [[0.999] * 15, [0.02] * 15])
    assert ks[0] > ks[1] and all(k == 0 or 4 <= k <= 15 for k in ks)
    assert controller.last_reason.startswith("allocator: B=2")
    # the step's time is recorded at the rows' own widths, every row drafting
    reports = [
        StepReport(ks[0], 3, [True, True] + [False] * (ks[0] - 2), 0.01, 2, two_phase=True),
        StepReport(ks[1], 1, [False] * ks[1], 0.01, 2, two_phase=True),
    ]
    controller.record([a, b], reports)
    assert controller.plan(views, [a, b]) == [15, 15] and controller.allocates()


def test_a_draft_cap_limits_what_two_phase_rows_draft_and_so_what_they_may_verify() -> None:
    """``slots_draft_cap``: two-phase rows draft at most that many positions (a narrow draft
    graph on a CUDA-graph runner), so the allocation never exceeds it."""
    active = _slots()
    goodput = active.spec.goodput.model_copy(update={"slots_draft_cap": 7})
    spec = active.spec.model_copy(update={"goodput": goodput})
    capped = Active(1, spec, build_policy(spec), OnlineModels(goodput, 16, cost_table=TABLE))
    controller = StepController(Source(capped), 16, random.Random(0))
    a, b = controller.start(Task.MATH, 0.9, 7), controller.start(Task.MATH, 0.9, 7)
    near_end = RequestView("b", 3, [4, 4, 4], 2, 3, {}, [15] * 3, 5)  # 5 drafts left
    views = [_view("a", 3, 2, [4, 4, 4]), near_end]
    assert controller.plan(views, [a, b]) == [7, 5]  # capped; a row's own ceiling still holds
    assert controller.allocates()
    ks = controller.allocate(views, [a, b], [[0.999] * 7, [0.999] * 5])
    assert ks[0] <= 7 and ks[1] <= 5
    with pytest.raises(ValueError):
        GoodputSpec(slots_draft_cap=0)


def test_slots_mode_plans_a_batch_below_its_minimum_as_one_shared_k_in_one_phase() -> None:
    """A two-phase step waits on the host between draft and verify; below ``slots_min_batch``
    rows the slots policy plans one k for the batch, as in shared mode."""
    controller = StepController(Source(_slots(min_batch=3)), 16, random.Random(0))
    steps = [controller.start(Task.MATH, 0.9, 7) for _ in range(3)]
    views = [_view(rid, 3, 2, [4, 4, 4]) for rid in "abc"]
    ks = controller.plan(views[:2], steps[:2])
    assert not controller.allocates() and ks[0] == ks[1]  # one k, decided before drafting
    controller.record(
        steps[:2], [StepReport(ks[0], 3, [True] * 2 + [False] * (ks[0] - 2), 0.01, 2)] * 2
    )
    assert controller.plan(views, steps) == [15, 15, 15] and controller.allocates()


def _auto_mode_run(
    steps: int,
    timing: Callable[[int, bool], tuple[float, float]],
    overlap: bool = False,
    num_rows: int = 3,
    table: CostTable = TABLE,
    set_up_calls: Collection[int] = (),
    prefill: Callable[[int, bool], float] | None = None,
    tell_prefill: bool = True,
    chooser: Callable[[ModeSettings], StepModeChooser] | None = None,
    controller_type: type[StepController] = StepController,
    **settings: Any,
) -> tuple[StepController, list[bool]]:
    """``num_rows`` rows under goodput's auto step mode (short learning blocks, two-phase from
    2 rows) for ``steps`` engine calls of one step each; ``timing(n, two_phase)`` gives call
    n's (reported step seconds, wall seconds to the next ``plan`` on the controller's clock).
    ``overlap``: ``prepare`` after each step's ``record``, as the embedded engine calls it
    behind its steps; ``set_up_calls``: calls whose reports say they set something up on
    first use (``StepReport.first_use``); ``prefill(n, last call two-phase)``: seconds of
    admissions' prefill the engine runs before call n's ``plan``, told by ``prefill_time``
    unless ``tell_prefill`` is off; ``chooser``: the engine's step-mode chooser as it stands
    before the first call (built from the policy's settings); ``controller_type``: the
    controller's class. The modes each call ran."""
    goodput = QUIET.model_copy(
        update={
            "step_mode": "auto",
            "slots_min_batch": 2,
            "mode_probe_steps": 2,
            "mode_learn_steps": 4,
            "mode_reprobe_steps": 30,
            **settings,
        }
    )
    spec = PolicySpec(kind="goodput", goodput=goodput)
    models = OnlineModels(goodput, block_size=16, cost_table=table)
    now = [0.0]
    controller = controller_type(
        Source(Active(1, spec, build_policy(spec), models)),
        16,
        random.Random(0),
        clock=lambda: now[0],
    )
    if chooser is not None:  # (kept by the controller: the same settings)
        controller._modes, controller._modes_spec = chooser(ModeSettings.of(goodput)), goodput
    rows = [controller.start(Task.MATH, 0.9, 7) for _ in range(num_rows)]
    ids = ["abcdefgh"[i] for i in range(num_rows)]
    lengths: dict[str, list[int]] = {rid: [] for rid in ids}
    ran: dict[str, list[int]] = {rid: [] for rid in ids}
    modes = []
    for n in range(steps):
        if prefill is not None:
            seconds = prefill(n, bool(modes) and modes[-1])
            now[0] += seconds
            if seconds and tell_prefill:
                controller.prefill_time(seconds)
        views = [RequestView(r, n, lengths[r], num_rows, n, {}, ran[r], 15) for r in ids]
        ks = controller.plan(views, rows)
        two_phase = controller.allocates()
        modes.append(two_phase)
        if two_phase:
            ks = controller.allocate(views, rows, [[0.9] * 15] * num_rows)
        for rid, k in zip(ids, ks, strict=True):
            lengths[rid].append(min(k, 3) + 1)
            ran[rid].append(k)
        reported, wall = timing(n, two_phase)
        reports = [
            StepReport(
                k,
                min(k, 3) + 1,
                [True] * min(k, 3),
                reported,
                num_rows,
                two_phase=two_phase,
                first_use=n in set_up_calls,
            )
            for k in ks
        ]
        controller.record(rows, reports)
        if overlap:
            controller.prepare(views, rows)
        now[0] += wall
    return controller, modes


# Drafting costs ten plain steps: no k pays, every batch-wide decision is plain.
NEVER = CostTable(
    batch_sizes=(1, 64),
    tokens_per_request=(1, 16),
    step_time_s=((5e-3, 5e-2), (8e-3, 8e-2)),
)


def _flat(n: int, two_phase: bool) -> tuple[float, float]:
    """Every call 10 ms, reported and wall, whatever its mode."""
    return 0.010, 0.010


def _two_phase_incumbent(settings: ModeSettings) -> StepModeChooser:
    """A chooser whose 3-row bucket has learnt two-phase steps (twice one phase's rate)."""
    chooser = StepModeChooser(settings)
    while chooser.incumbent(3) is None:
        two_phase = chooser.decide(3)
        chooser.record(3, two_phase, 20 if two_phase else 10, 0.01)
    assert chooser.incumbent(3) is True
    return chooser


def test_auto_mode_runs_a_two_phase_incumbent_plain_while_the_batch_runs_plain() -> None:
    """A bucket whose incumbent is two-phase (learnt under other traffic) no longer drafts
    every row's whole block when the batch-wide decision is plain (k = 0): the real pair's
    64-row mixed phase in session 56 (calls s56b, s56e) ran ~735 two-phase steps a run at
    3.4-3.7 ms, 620 of them verifying nothing, against 1.15 ms plain steps (0.44-0.70x no
    speculation in that phase). The step runs plain; where the batch-wide decision drafts it
    stays two-phase; ``mode_two_phase_when_plain`` restores the old behaviour."""
    for overlap in (False, True):
        controller, modes = _auto_mode_run(
            24, _flat, overlap=overlap, table=NEVER, chooser=_two_phase_incumbent
        )
        assert not any(modes), modes
        assert controller._modes is not None and controller._modes.incumbent(3) is True
        _, drafting = _auto_mode_run(24, _flat, overlap=overlap, chooser=_two_phase_incumbent)
        assert all(drafting[:20]), drafting  # drafting pays (TABLE): two-phase as before
        _, old = _auto_mode_run(
            24,
            _flat,
            overlap=overlap,
            table=NEVER,
            chooser=_two_phase_incumbent,
            mode_two_phase_when_plain=True,
        )
        assert all(old[:20]), old


def test_auto_mode_counts_only_drafting_steps_in_its_schedule() -> None:
    """A learning bucket in its one-phase block stays there while the batch runs plain: plain
    steps neither time a mode nor advance the schedule, so a block of one phase is one of
    drafting steps (plain steps using it up left the chooser only two-phase blocks to time).
    The controller as before session 56 (``_times_mode_step`` true for every step) advances."""

    def one_phase_block(settings: ModeSettings) -> StepModeChooser:
        chooser = StepModeChooser(settings)
        for _ in range(settings.probe_steps):  # the first (two-phase) learning block, spent
            chooser.decide(3)
        assert chooser.incumbent(3) is None and not chooser.peek(3)
        return chooser

    class Before(StepController):
        def _times_mode_step(self, drafted: bool) -> bool:
            return True

    controller, modes = _auto_mode_run(12, _flat, table=NEVER, chooser=one_phase_block)
    assert not any(modes)
    chooser = controller._modes
    assert chooser is not None and not chooser.peek(3)  # still its one-phase block
    assert chooser.rates(3) == (None, None)
    before, _ = _auto_mode_run(
        12, _flat, table=NEVER, chooser=one_phase_block, controller_type=Before
    )
    assert before._modes is not None and before._modes.peek(3)  # advanced to two phases


def test_auto_mode_measures_both_modes_and_runs_the_one_that_emits_more_per_second() -> None:
    """On an engine whose two-phase steps cost 30% more for the same tokens, auto mode tries
    both step modes, then plans one-phase steps (one shared k) but for rare re-probes."""

    def timing(n: int, two_phase: bool) -> tuple[float, float]:
        seconds = 0.013 if two_phase else 0.010
        return seconds, seconds

    _, modes = _auto_mode_run(64, timing)
    assert modes[:8] == [True, True, False, False, True, True, False, False]  # learning
    assert modes[8:32].count(True) <= 2  # one-phase now, but for one re-probe block of 2
    assert True in modes[8:40]  # ... which does come


def test_auto_mode_cuts_a_tried_block_that_loses_by_far_when_the_policy_asks() -> None:
    """``mode_cut_ratio`` (off by default) reaches the engine's chooser: learning starts
    one-phase, a two-phase block at a third of one-phase's rate is cut and decides the
    bucket one-phase at once (policies/step_mode.py)."""

    def timing(n: int, two_phase: bool) -> tuple[float, float]:
        seconds = 0.030 if two_phase else 0.010
        return seconds, seconds

    controller, modes = _auto_mode_run(24, timing, mode_probe_steps=4, mode_cut_ratio=0.75)
    assert modes[:6] == [False] * 4 + [True] * 2  # the two-phase block cut after 2 steps
    assert modes[6:] == [False] * 18
    (bucket,) = controller.step_modes()
    assert bucket.incumbent is False and bucket.paired_ratio == pytest.approx(1 / 3, rel=0.05)
    _, default = _auto_mode_run(8, timing, mode_probe_steps=4)
    assert default[:4] == [True] * 4  # the default: learning two-phase first, blocks whole


def test_auto_mode_does_not_learn_from_an_engine_call_that_set_something_up() -> None:
    """Two-phase steps are the faster (8 against 10 ms), but the first two-phase calls also
    capture their device allocation's graph (0.2 s each; session 52's compiled 8B warm pass:
    109 ms steps against ~19). Told those, the chooser learns one phase; with their reports'
    ``first_use`` it leaves them out and learns two."""

    def timing(n: int, two_phase: bool) -> tuple[float, float]:
        seconds = (0.2 if n < 2 else 0.008) if two_phase else 0.010
        return seconds, seconds

    told, _ = _auto_mode_run(40, timing)
    (bucket,) = told.step_modes()
    assert bucket.incumbent is False
    skipped, modes = _auto_mode_run(40, timing, set_up_calls={0, 1})
    assert modes[:2] == [True, True]  # (learning starts two-phase: those are the set-ups)
    (bucket,) = skipped.step_modes()
    assert bucket.incumbent is True
    assert bucket.two_phase_tok_s == pytest.approx(12 / 0.008, rel=0.01)


def test_auto_mode_times_each_engine_call_by_the_wall_clock() -> None:
    """Session 36's compiled 8B call: the engine reported two-phase 64-row steps as cheap as
    one-phase ones, but each cost a host round trip the report leaves out (one-phase steps
    burst and share theirs), and the chooser kept two-phase steps that lost 2-5%. Here
    a two-phase step reports 9 ms and takes 14 ms from one ``plan`` to the next, a one-phase
    step reports 10 ms and takes 11 ms: auto mode runs one phase. (Fed the reported times,
    it would run two.) A gap far past the reported time (the engine waited for work) is not
    counted: the reported time stands in for it."""

    def timing(n: int, two_phase: bool) -> tuple[float, float]:
        reported, wall = (0.009, 0.014) if two_phase else (0.010, 0.011)
        return reported, wall + (5.0 if n == 20 else 0.0)  # call 20: idle for 5 s after it

    controller, modes = _auto_mode_run(40, timing)
    assert modes[:8] == [True, True, False, False, True, True, False, False]  # learning
    assert modes[8:32].count(True) <= 2  # one-phase, but for a re-probe block of 2
    (bucket,) = controller.step_modes()
    assert bucket.incumbent is False
    # each step emits 12 tokens: 12 / 0.011 s one-phase, 12 / 0.014 s two-phase; the idle
    # 5 s (a one-phase step) did not count
    assert bucket.one_phase_tok_s == pytest.approx(12 / 0.011, rel=0.01)
    assert bucket.two_phase_tok_s == pytest.approx(12 / 0.014, rel=0.01)


def test_auto_mode_leaves_the_admissions_prefill_out_of_the_steps_it_times() -> None:
    """An admission's prefill runs before the next call's ``plan``, so timed from one
    ``plan`` to the next it lands on the steps before it (the real pair: 4-11 ms a burst
    against ~1.1 ms plain 64-row steps). Here two-phase steps cost 12 ms and one-phase ones
    10 ms for the same tokens, and a 10 ms prefill follows every one-phase call: told it
    (``prefill_time``), the chooser runs one phase; timing the prefill into the steps, it
    would run two."""

    def timing(n: int, two_phase: bool) -> tuple[float, float]:
        seconds = 0.012 if two_phase else 0.010
        return seconds, seconds

    def prefill(n: int, last_two_phase: bool) -> float:
        return 0.0 if n == 0 or last_two_phase else 0.010

    told, modes = _auto_mode_run(40, timing, prefill=prefill)
    (bucket,) = told.step_modes()
    assert bucket.incumbent is False
    assert modes[8:32].count(True) <= 2  # one-phase, but for a re-probe block of 2
    assert bucket.one_phase_tok_s == pytest.approx(12 / 0.010, rel=0.01)
    untold, _ = _auto_mode_run(40, timing, prefill=prefill, tell_prefill=False)
    (bucket,) = untold.step_modes()
    assert bucket.incumbent is True


def test_behind_an_overlapping_engine_the_modes_are_told_in_prepare_not_plan() -> None:
    """The embedded engine calls ``prepare`` while the device runs a step: there the chooser
    learns the last call's steps, off the host's critical path between two steps (on the real
    pair, H100 call s44a, goodput's plain steps took 2.4-2.7% longer than no-spec's, most
    of it host work between steps). ``plan`` only times them; the modes still come out right,
    and a batch below ``slots_min_batch`` (never two-phase) keeps no chooser bucket at all."""

    def timing(n: int, two_phase: bool) -> tuple[float, float]:
        seconds = 0.013 if two_phase else 0.010
        return seconds, seconds

    controller, modes = _auto_mode_run(64, timing, overlap=True)
    # learning, one step longer than without the overlap (told a call later)
    assert modes[:9] == [True, True, False, False, True, True, False, False, True]
    assert modes[9:32].count(True) <= 2  # then one phase but for a re-probe block of 2
    (bucket,) = controller.step_modes()
    assert bucket.incumbent is False
    chooser = controller._modes
    assert chooser is not None

    def told() -> int:
        return sum(chooser._buckets[chooser.bucket(3)].steps)

    before = told()
    views = [RequestView(r, 64, [4] * 64, 3, 64, {}, [0] * 64, 15) for r in "abc"]
    rows = controller._rows_memo.controllers if controller._rows_memo else []
    controller.plan(views, rows)  # the last call's step: timed, not yet told
    assert told() == before
    controller.prepare(views, rows)
    assert told() == before + 1

    single, _ = _auto_mode_run(12, timing, overlap=True, num_rows=1)
    assert single.step_modes() == []


def _told_models(shared: bool) -> list[tuple[Any, ...]]:
    """What six plain steps of five rows (three math) teach a goodput policy's online models
    (every ``record_steps`` and ``record_step_times`` call), the steps' reports one object for
    every row (``shared``, as the engine hands a plain step's) or one per row."""
    active = _goodput()
    models = active.models
    assert models is not None
    told: list[tuple[Any, ...]] = []
    steps_of, times_of = models.record_steps, models.record_step_times

    def record_steps(task: Task, ks: Sequence[int], lengths: Sequence[int]) -> None:
        told.append((task, sorted(ks), sorted(lengths)))
        steps_of(task, ks, lengths)

    def record_step_times(times: Sequence[tuple[int, float, float, float]]) -> None:
        told.append(("times", list(times)))
        times_of(times)

    models.record_steps = record_steps  # type: ignore[method-assign,assignment]
    models.record_step_times = record_step_times  # type: ignore[method-assign,assignment]
    controller = StepController(Source(active), 16, random.Random(0))
    tasks = [Task.MATH, Task.CHAT, Task.MATH, Task.CODE, Task.MATH]
    rows = [controller.start(task, 0.9, 0) for task in tasks]
    for _ in range(6):
        one = StepReport(0, 1, [], 0.002, len(rows))
        fresh = [StepReport(0, 1, [], 0.002, len(rows)) for _ in rows]
        controller.record(rows, [one] * len(rows) if shared else fresh)
    controller._fold()
    with pytest.raises(ValueError, match="controllers for"):
        controller.record(rows, [one] * (len(rows) - 1))
    return sorted(told, key=repr)


def test_a_plain_steps_shared_report_is_recorded_as_one_per_row() -> None:
    """The engine hands every row of a plain step the same report object; the controller
    records it once per task group (not row by row, behind every plain step), and its models
    learn what per-row reports of the same values teach them."""
    shared = _told_models(shared=True)
    assert shared == _told_models(shared=False)
    assert (Task.MATH, [0, 0, 0], [1, 1, 1]) in shared  # each step: three math rows


def test_the_default_step_mode_follows_the_engine() -> None:
    """``step_mode: engine`` (the default) is auto where the engine's rows verify at their own
    widths (two-phase steps then at ``slots_min_batch`` rows, measured against one phase) and
    shared where a step pads its rows to the widest (never two-phase: nothing to save)."""
    goodput = QUIET.model_copy(update={"slots_min_batch": 2})
    assert GoodputSpec().step_mode == "engine"
    spec = PolicySpec(kind="goodput", goodput=goodput)
    views = [_view("a", 3, 2, [4, 4, 4]), _view("b", 3, 2, [4, 4, 4])]
    planned = {}
    for ragged in (False, True):
        models = OnlineModels(goodput, block_size=16, cost_table=TABLE)
        active = Active(1, spec, build_policy(spec), models)
        controller = StepController(Source(active), 16, random.Random(0), ragged=ragged)
        assert controller.step_mode(active) == ("auto" if ragged else "shared")
        rows = [controller.start(Task.MATH, 0.9, 7) for _ in views]
        planned[ragged] = [controller.plan(views, rows) for _ in range(3)]
        assert controller.allocates() == ragged  # auto learns two-phase first
    assert len({k for ks in planned[False] for k in ks}) == 1  # one shared k
    assert planned[True][0] == [15, 15]  # every row drafts whole, then allocates


def test_shared_mode_never_allocates_and_slots_need_a_cost_model() -> None:
    controller = StepController(Source(_goodput()), 16, random.Random(0))
    steps = controller.start(Task.MATH, 0.9, 7)
    controller.plan([_view("a", 3, 1, [4, 4, 4])], [steps])
    assert not controller.allocates()
    spec = PolicySpec(kind="goodput", goodput=QUIET.model_copy(update={"step_mode": "slots"}))
    no_table = Active(1, spec, build_policy(spec), OnlineModels(spec.goodput, block_size=16))
    controller = StepController(Source(no_table), 16, random.Random(0))
    steps = controller.start(Task.MATH, 0.9, 7)
    controller.plan([_view("a", 3, 1, [4, 4, 4])], [steps])
    assert not controller.allocates()  # nothing to price a ragged step with: shared mode


def _cadence_goodput(**settings: Any) -> Active:
    spec = QUIET.model_copy(update=settings)
    models = OnlineModels(spec, block_size=16, cost_table=TABLE)
    policy_spec = PolicySpec(kind="goodput", goodput=spec)
    return Active(1, policy_spec, build_policy(policy_spec), models)


def _run_steps(
    controller: StepController,
    rows: list[Any],
    ids: list[str],
    steps: int,
    step_time_s: float,
    start: int = 0,
) -> list[int]:
    """Steps as the engine runs them (plan; the step; record and prepare behind it), with each
    request's history lists growing in place as the engine's do; the shared k of each."""
    lengths: dict[str, list[int]] = {rid: [] for rid in ids}
    spec: dict[str, list[int]] = {rid: [] for rid in ids}

    def views(n: int) -> list[RequestView]:
        return [RequestView(r, n, lengths[r], len(ids), n, {}, spec[r], 15) for r in ids]

    chosen = []
    for n in range(start, start + steps):
        ks = controller.plan(views(n), rows)
        chosen.append(ks[0])
        for rid, k in zip(ids, ks, strict=True):
            lengths[rid].append(min(k, 3) + 1)
            spec[rid].append(k)
        reports = [
            StepReport(k, min(k, 3) + 1, [True] * min(k, 3), step_time_s, len(ids)) for k in ks
        ]
        controller.record(rows, reports)
        controller.prepare(views(n + 1), rows)
    return chosen


def test_short_steps_space_decisions_while_the_rows_stay_the_same() -> None:
    """A host-bound engine (steps of 20 us here, far below any decision's host time): the
    shared k is re-decided only every max_replan_steps steps, and the steps in between reach
    the online models before the next decision."""
    active = _cadence_goodput(max_replan_steps=4, host_budget=0.01)
    controller = StepController(Source(active), 16, random.Random(0))
    rows = [controller.start(Task.MATH, 1.0, 7) for _ in range(2)]
    _run_steps(controller, rows, ["a", "b"], 40, step_time_s=20e-6)
    assert controller.cadence(active) == 4
    assert 10 <= controller.decisions <= 12  # 40 steps, one decision per 4 (+ the first)
    models = active.models
    assert models is not None
    trials = models.observe(Task.MATH)["accept_trials"]
    # every drafted step but at most the last 2 x 4 unfolded ones is in the model (2 rows)
    assert trials[0] >= 2 * (40 - 8) * 0.9


def test_long_steps_decide_every_step() -> None:
    """When the step is long against a decision (a large target), every step is decided,
    as before: the controller's time hides behind the device."""
    active = _cadence_goodput(max_replan_steps=8)
    controller = StepController(Source(active), 16, random.Random(0))
    rows = [controller.start(Task.MATH, 1.0, 7) for _ in range(2)]
    _run_steps(controller, rows, ["a", "b"], 20, step_time_s=5.0)
    assert controller.cadence(active) == 1
    assert controller.decisions >= 20


def test_a_batch_whose_rows_change_is_decided_afresh_and_one_means_every_step() -> None:
    active = _cadence_goodput(max_replan_steps=8)
    controller = StepController(Source(active), 16, random.Random(0))
    rows = [controller.start(Task.MATH, 1.0, 7) for _ in range(2)]
    _run_steps(controller, rows, ["a", "b"], 16, step_time_s=20e-6)
    before = controller.decisions
    # a new request in place of "b": its rows differ, so the next step is decided at once
    rows[1] = controller.start(Task.CHAT, 1.0, 7)
    _run_steps(controller, rows, ["a", "c"], 1, step_time_s=20e-6, start=16)
    assert controller.decisions == before + 1
    # max_replan_steps: 1 restores a decision per step
    every = _cadence_goodput(max_replan_steps=1)
    controller = StepController(Source(every), 16, random.Random(0))
    rows = [controller.start(Task.MATH, 1.0, 7) for _ in range(2)]
    _run_steps(controller, rows, ["a", "b"], 20, step_time_s=20e-6)
    assert controller.decisions >= 20


def test_a_probe_serves_one_step_only() -> None:
    """A probe (one captured width wider, to learn the positions past k) is no decision to
    keep: however long decisions are spaced, the step after a probe is decided again."""
    active = _cadence_goodput(max_replan_steps=8, probe_probability=1.0, probe_min_steps=1e9)
    controller = StepController(Source(active), 16, random.Random(0))
    rows = [controller.start(Task.CHAT, 1.0, 7) for _ in range(2)]
    chosen = _run_steps(controller, rows, ["a", "b"], 30, step_time_s=20e-6)
    width = controller.batch_width
    assert width is not None and width.last[0] == "probe"
    assert controller.decisions >= 29  # every step probes, so every step is decided
    assert len(set(chosen)) >= 1


def test_a_switch_to_drafting_is_held_for_one_call_then_twice_as_long_each_time() -> None:
    """``ramp_drafting_holds``: a decision that turns drafting on serves one call, and each
    that keeps drafting after it twice as many as the last, up to the spacing (8): over 15
    steps decided at steps 0 (twice: the step, then the next one prepared), 2, 6 and 14,
    against 0 (twice) and 8 without it; a batch that stays plain is spaced as before."""

    def decided(ramp: bool, math_rate: float) -> tuple[list[int], int, int]:
        rates = dict(QUIET.prior_accept_rates) | {Task.MATH: [math_rate]}
        active = _cadence_goodput(
            max_replan_steps=8, ramp_drafting_holds=ramp, prior_accept_rates=rates
        )
        controller = StepController(Source(active), 16, random.Random(0))
        rows = [controller.start(Task.MATH, 1.0, 7) for _ in range(2)]
        chosen = _run_steps(controller, rows, ["a", "b"], 15, step_time_s=20e-6)
        return chosen, controller.decisions, controller.cadence(active)

    chosen, ramped, cadence = decided(True, 0.95)
    assert min(chosen) > 0 and cadence == 8  # drafting throughout, decisions spaced by 8
    assert ramped == 5
    assert decided(False, 0.95)[1] == 3
    plain, spaced, _ = decided(True, 0.05)
    assert max(plain) == 0 and spaced == decided(False, 0.05)[1] == 3


def test_a_request_replaced_by_one_of_its_task_keeps_the_held_decision() -> None:
    """A busy server replaces an ended request by a new one most steps. At 8 rows or more a
    batch with at most one row in 8 changed keeps the held k (as many decisions as when nothing
    changes); a mix that moved further is decided at once (one decision more); below 8 rows
    any new request is (its own history weighs in the decision)."""

    def decisions(batch: int, replaced: list[Task]) -> int:
        active = _cadence_goodput(max_replan_steps=8)
        controller = StepController(Source(active), 16, random.Random(0))
        tasks = [Task.MATH, Task.CHAT] * (batch // 2)
        rows = [controller.start(task, 1.0, 7) for task in tasks]
        ids = [f"r{i}" for i in range(batch)]
        _run_steps(controller, rows, ids, 17, step_time_s=20e-6)
        assert controller.cadence(active) == 8
        for i, task in enumerate(replaced):  # rows 1, 3, ... (chat) ended; new ones take over
            rows[2 * i + 1], ids[2 * i + 1] = controller.start(task, 1.0, 7), f"new{i}"
        _run_steps(controller, rows, ids, 4, step_time_s=20e-6, start=17)
        return controller.decisions

    unchanged = decisions(8, [])
    assert decisions(8, [Task.CHAT, Task.CHAT]) == unchanged  # same mix
    assert decisions(8, [Task.MATH]) == unchanged  # one row of 8 changed task
    assert decisions(8, [Task.MATH, Task.MATH]) == unchanged + 1  # two rows of 8
    assert decisions(2, [Task.CHAT]) == decisions(2, []) + 1  # below 8 rows: any new request


def test_steps_are_priced_at_the_engines_call_time_where_longer_than_the_runners() -> None:
    """The engine tells the call's wall time over its steps before the steps are recorded
    (``call_time``): the cost model learns it where the runner's time leaves out host work the
    device did not hide (the real pair, H100 call s42d: ~0.7-1 ms a drafting 64-row step,
    ~0.2 ms a plain one in bursts, so the runner's times priced drafting ~20% low against
    plain). A call faster than the runner's step (a clock that is not the engine's) keeps it."""

    def priced(call_s: float | None) -> tuple[float, int]:
        active = _goodput()
        controller = StepController(Source(active), 16, random.Random(0))
        rows = [controller.start(Task.MATH, 1.0, 7) for _ in range(8)]
        ids = [f"r{i}" for i in range(8)]
        ks = []
        for n in range(40):
            if call_s is not None:
                controller.call_time(call_s)
            ks += _run_steps(controller, rows, ids, 1, step_time_s=6e-3, start=n)
        controller._fold()
        assert active.models is not None
        cost = active.models.step_cost()
        assert cost is not None
        return cost.step_time_s(8, ks[-1]), ks[-1]

    runner, k = priced(None)
    assert k > 0
    assert runner == pytest.approx(6e-3, rel=0.15)  # learnt from the runner's 6 ms
    wall, _ = priced(9e-3)
    assert wall == pytest.approx(9e-3, rel=0.15)  # learnt from the call's 9 ms
    # (the decisions' spacing follows their measured host time: equal up to a fold's timing)
    slower, k_slower = priced(1e-3)
    assert slower == pytest.approx(runner, rel=0.01) and k_slower == k


def test_auto_mode_holds_its_probes_while_the_batch_runs_plain() -> None:
    """Where no drafting pays (the batch-wide decision is k = 0), a two-phase step the chooser
    wants only to measure (learning, or a re-probe) would draft every row's whole block for
    nothing (the real pair's 64-row phase, session 45: 4.9 ms probes against 1.47 ms plain
    steps): the step runs plain, one phase, and the chooser's schedule waits; the plain steps
    are not timed into either mode (a pair of a plain block and a drafting one compares the
    traffic, not the modes). With ``mode_probe_when_plain`` they run as before."""

    def timing(n: int, two_phase: bool) -> tuple[float, float]:
        seconds = 0.013 if two_phase else 0.010
        return seconds, seconds

    for overlap in (False, True):
        controller, modes = _auto_mode_run(40, timing, overlap=overlap, table=NEVER)
        assert not any(modes), modes
        chooser = controller._modes
        assert chooser is not None and chooser.peek(3)  # still wants its two-phase block
        assert chooser.rates(3) == (None, None)  # plain steps are neither mode's (session 56)
        _, probing = _auto_mode_run(40, timing, table=NEVER, mode_probe_when_plain=True)
        assert probing[:2] == [True, True]  # learning as before
