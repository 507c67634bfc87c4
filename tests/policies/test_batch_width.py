"""BatchWidth: one k per engine step for a padded batch, from exactly the rows of that step."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from policies.acceptance import blend_request_history, expected_by_k, request_window
from policies.batch_width import BatchWidth
from policies.costmodel import CostModel, CostTable
from policies.model import GoodputSpec
from policies.online import OnlineModels
from policies.types import TASKS, StepRow, Task

# Shaped like the measured Qwen3-8B H200 table: width 8 ~1.16x a plain step at batch 1, ~1.9x
# at 64; width 16 ~3.3x at 64.
TABLE = CostTable(
    batch_sizes=(1, 8, 64),
    tokens_per_request=(1, 8, 16),
    step_time_s=((7.5e-3, 8.7e-3, 8.7e-3), (8.4e-3, 9.0e-3, 9.7e-3), (11.5e-3, 22e-3, 37.8e-3)),
)
H200 = Path(__file__).resolve().parents[2] / "cost_tables/qwen3-8b-h200.json"
# The planner's other mechanisms, tested uncalibrated (``shared_calibration`` is on by default;
# its own tests switch it on).
QUIET = GoodputSpec(probe_probability=0.0, hysteresis=0.0, shared_calibration=False)


class Learned:
    """OnlineModels.observe stand-in: fixed rates per task, counts its calls."""

    def __init__(self, rates: Mapping[Task, float], block: int, trials: float = 1e6):
        self.rates = dict(rates)
        self.block = block
        self.trials = trials
        self.calls = 0
        self.cost: Any = CostModel(TABLE, block_size=block, draft_cost_fraction=0.16).snapshot()

    def __call__(self, task: Task) -> dict[str, Any]:
        self.calls += 1
        n = self.block - 1
        return {
            "accept_rates": (self.rates[task],) * n,
            "accept_trials": (self.trials,) * n,
            "step_cost": self.cost,
        }


class FixedCost:
    """T(B, k) by verify width only: plain 1.0, width 8 ``narrow``, width 16 ``wide``."""

    def __init__(self, narrow: float, wide: float):
        self.narrow, self.wide = narrow, wide

    def step_time_s(self, batch_size: int, spec_tokens: int) -> float:
        if spec_tokens <= 0:
            return 1.0
        return self.narrow if spec_tokens <= 7 else self.wide


class Request:
    """A row as the engine holds it: its history, the k each step ran with, what is left."""

    def __init__(self, row_id: str, task: Task, remaining: int = 10_000):
        self.row_id, self.task, self.remaining = row_id, task, remaining
        self.accept_lengths: list[int] = []
        self.spec_tokens: list[int] = []

    def row(self, block: int = 16) -> StepRow:
        ceiling = min(block, self.remaining) - 1
        return StepRow(self.row_id, self.task, self.accept_lengths, self.spec_tokens, ceiling)

    def ran(self, spec_tokens: int, accept_length: int) -> None:
        self.spec_tokens.append(spec_tokens)
        self.accept_lengths.append(accept_length)
        self.remaining -= accept_length


def _step(width: BatchWidth, requests: list[Request], learned: Any, block: int = 16) -> int:
    return width.decide([r.row(block) for r in requests], learned)


def _ingest(width: BatchWidth, requests: list[Request]) -> Any:
    """The requests' histories into the planner's windows, as a decision reads them."""
    return width.windows.ingest(
        [r.row_id for r in requests],
        [r.task for r in requests],
        [r.accept_lengths for r in requests],
        [r.spec_tokens for r in requests],
    )


def test_one_call_per_step_decides_for_every_row_and_reads_each_task_once() -> None:
    learned = Learned({Task.MATH: 0.8, Task.CHAT: 0.8, Task.CODE: 0.8}, block=16)
    width = BatchWidth(QUIET, 16, min_spec_tokens=4)
    requests = [Request(f"r{i}", Task.MATH if i % 2 else Task.CHAT) for i in range(8)]
    assert _step(width, requests, learned) in (7, 15)
    assert width.steps == 1 and learned.calls == 2  # the step's two tasks, once each
    assert width.decide([], learned) == 0 and width.steps == 1  # no rows: nothing to verify


def test_load_and_acceptance_decide_whether_the_batch_drafts() -> None:
    # Easy text drafts at every load; harder text only when the verify is cheap (batch 1).
    cases = ((0.8, 1, True), (0.8, 64, True), (0.45, 1, True), (0.45, 64, False))
    for rate, batch, expect_drafting in cases:
        learned = Learned({t: rate for t in Task}, block=8)
        width = BatchWidth(QUIET, 8, 4)
        k = _step(width, [Request(f"r{i}", Task.MATH) for i in range(batch)], learned, 8)
        assert (k > 0) is expect_drafting, (rate, batch, k)


def test_rows_own_steps_move_the_shared_choice() -> None:
    # The task says drafting pays at batch 64; every row then rejects its first draft token.
    learned = Learned({t: 0.7 for t in Task}, block=8)
    width = BatchWidth(QUIET, 8, 4)
    requests = [Request(f"r{i}", Task.CODE) for i in range(64)]
    k = _step(width, requests, learned, 8)
    assert k == 7
    for _ in range(12):
        for request in requests:
            request.ran(k, 1)  # accept length 1: nothing accepted
        k = _step(width, requests, learned, 8)
    assert k == 0


def test_hysteresis_keeps_the_previous_decision_inside_its_margin() -> None:
    learned = Learned({t: 0.6 for t in Task}, block=8)
    requests = [Request(f"r{i}", Task.CHAT) for i in range(40)]
    free = BatchWidth(QUIET, 8, 4)
    sticky = BatchWidth(QUIET.model_copy(update={"hysteresis": 0.5}), 8, 4)
    assert _step(free, requests, learned, 8) == _step(sticky, requests, learned, 8) == 7
    learned.rates = {t: 0.45 for t in Task}  # drafting now loses, by ~3%
    assert _step(free, requests, learned, 8) == 0
    assert _step(sticky, requests, learned, 8) == 7
    assert "hold" in sticky.reason


def test_probe_one_width_wider_while_few_steps_drafted_it() -> None:
    spec = GoodputSpec(probe_probability=0.5, probe_min_steps=100, hysteresis=0.0)
    requests = [Request(f"r{i}", Task.MATH) for i in range(64)]
    # 10 trials per position: at rate 0.8 that is ~10 / 0.8^j steps reaching position j,
    # a few dozen drafted steps of width 16 (< 100).
    few = Learned({t: 0.8 for t in Task}, block=16, trials=10)
    width = BatchWidth(spec, 16, 4, rng_u=lambda: 0.1)
    assert _step(width, requests, few) == 15  # chose 7 at batch 64, probed width 16
    assert "probe" in width.reason
    many = Learned({t: 0.8 for t in Task}, block=16, trials=1000)
    assert _step(BatchWidth(spec, 16, 4, rng_u=lambda: 0.1), requests, many) == 7
    assert _step(BatchWidth(spec, 16, 4, rng_u=lambda: 0.9), requests, few) == 7


def test_a_probe_is_not_held_by_hysteresis() -> None:
    """Fault 1 of issue 13: k = 15 costs 0.8% more than k = 7, under the 3% hysteresis, and
    gains 0.4% tokens. The planner decides 7 and probes 15 once; the old planner then held
    15 for good ([7, 15, 15, 15, ...]), since the probed k was its hold reference."""
    spec = GoodputSpec(probe_probability=0.5, hysteresis=0.03)
    draws = iter([1.0, 0.0] + [1.0] * 50)
    learned = Learned({t: 0.5 for t in Task}, block=16, trials=0.0)
    learned.cost = FixedCost(narrow=1.2, wide=1.21)
    width = BatchWidth(spec, 16, 4, rng_u=lambda: next(draws))
    request = Request("a", Task.MATH)
    ks = []
    for _ in range(10):
        ks.append(_step(width, [request], learned))
        request.ran(ks[-1], 2)
    assert ks == [7, 15] + [7] * 8


def test_probes_stop_once_the_wider_width_was_drafted_often_enough() -> None:
    """Fault 2 of issue 13: at batch 8 with acceptance 0.6, k = 7 beats 15 by ~5% and every
    other step is a probe candidate. The old rule (200 trials at every probed position) is
    never met at position 15 (0.6^14 of the drafted steps reach it) and probed 50% of the
    steps for good; counting the steps that drafted the width, probes stop."""
    spec = GoodputSpec(probe_probability=0.5, hysteresis=0.0)
    table = CostTable.from_dict(json.loads(H200.read_text()))
    models = OnlineModels(spec, 16, table)
    rng = random.Random(0)
    width = BatchWidth(spec, 16, 4, rng_u=rng.random)
    requests = [Request(f"r{i}", Task.MATH) for i in range(8)]
    ks = []
    for _ in range(1500):
        k = _step(width, requests, models.observe)
        ks.append(k)
        for request in requests:
            accepted = 0
            while accepted < k and rng.random() < 0.6:
                accepted += 1
            request.ran(k, accepted + 1)
            models.record_step(Task.MATH, k, accepted + 1)
    late = ks[500:]
    assert set(late) <= {7, 15}
    assert late.count(15) / len(late) < 0.05  # at most ~ probe_min_steps x ln 2 / half-life


def test_a_step_clamped_near_the_end_is_no_rejection() -> None:
    """Fault 4 of issue 13: the engine clamps k to what a request can still emit. A step that
    ran k = 3 and accepted all 3 is a success at positions 1-3 and says nothing about 4; the
    old planner recorded it at the planned k = 7 as a rejection at 4 and stopped drafting
    (k = 0 here, where drafting pays only above 6 tokens per step)."""
    learned = Learned({t: 0.95 for t in Task}, block=8)
    learned.cost = FixedCost(narrow=6.0, wide=6.0)
    width = BatchWidth(QUIET, 8, 4)
    requests = [Request(f"r{i}", Task.CODE) for i in range(64)]
    assert _step(width, requests, learned, 8) == 7
    for _ in range(12):
        for request in requests:
            request.ran(3, 4)
        k = _step(width, requests, learned, 8)
    assert k == 7


def test_a_new_request_at_batch_1_does_not_inherit_the_finished_ones_window() -> None:
    """Fault 5 of issue 13: request a rejected every draft and drafting stopped; b, the next
    request at batch 1, is fresh and easy. The old planner decided b's first step from the
    previous step's rows (a's window) and gave it k = 0."""
    learned = Learned({t: 0.8 for t in Task}, block=16)
    learned.cost = FixedCost(narrow=4.0, wide=4.0)
    width = BatchWidth(QUIET, 16, 4)
    finished = Request("a", Task.MATH)
    for _ in range(20):
        k = _step(width, [finished], learned)
        finished.ran(k, 1)
    assert k == 0
    assert _step(width, [Request("b", Task.MATH)], learned) == 15
    assert len(width.windows) == 1


def test_a_row_near_its_end_counts_only_what_it_can_verify() -> None:
    learned = Learned({t: 0.9 for t in Task}, block=16)
    learned.cost = FixedCost(narrow=1.5, wide=1.5)
    width = BatchWidth(QUIET, 16, 4)
    assert _step(width, [Request("a", Task.MATH, remaining=30)], learned) == 15
    # One token left: the row can verify nothing, and a plain step wins.
    assert _step(BatchWidth(QUIET, 16, 4), [Request("b", Task.MATH, remaining=1)], learned) == 0


def test_rows_that_left_the_batch_are_forgotten_and_their_slots_reused() -> None:
    learned = Learned({t: 0.7 for t in Task}, block=8)
    width = BatchWidth(QUIET, 8, 4)
    a, b = Request("a", Task.MATH), Request("b", Task.CHAT)
    _step(width, [a, b], learned, 8)
    a.ran(7, 2)
    _step(width, [a], learned, 8)
    assert len(width.windows) == 1 and width.windows.rows_per_task[2] == 0  # chat left
    _step(width, [a, Request("c", Task.CODE)], learned, 8)
    assert len(width.windows) == 2


def test_bad_rows_are_named() -> None:
    learned = Learned({t: 0.7 for t in Task}, block=8)
    width = BatchWidth(QUIET, 8, 4)
    with pytest.raises(ValueError, match="'a': 1 spec_tokens for 2 accept_lengths"):
        width.decide([StepRow("a", Task.MATH, [2, 3], [7], 7)], learned)
    with pytest.raises(ValueError, match="twice"):
        width.decide([StepRow("b", Task.MATH, [], [], 7)] * 2, learned)


def test_any_row_with_the_five_fields_will_do() -> None:
    @dataclass(frozen=True)
    class Row:  # e.g. policies.baselines.base.Row, which also carries draft confidence
        row_id: str
        task: Task
        accept_lengths: list[int]
        spec_tokens: list[int]
        max_spec_tokens: int
        draft_confidence: None = None

    learned = Learned({t: 0.8 for t in Task}, block=16)
    tuples = BatchWidth(QUIET, 16, 4).decide([StepRow("a", Task.MATH, [3], [7], 15)], learned)
    plain = BatchWidth(QUIET, 16, 4).decide([Row("a", Task.MATH, [3], [7], 15)], learned)  # type: ignore[list-item]
    assert tuples == plain == 15


@pytest.mark.parametrize("rows", [3, 40])
@pytest.mark.parametrize("is_caught_up", [False, True])
@pytest.mark.parametrize("plain_per_entry", [1, 3])
def test_expected_totals_match_the_policy_blend(
    rows: int, is_caught_up: bool, plain_per_entry: int
) -> None:
    """Step by step (one new step per row per call), or a whole history at once (a row first
    seen mid-request, or an id reused by a new request); every step a window entry, or every
    drafted step and every 3 plain ones in a row."""
    rng = random.Random(rows)
    spec = QUIET.model_copy(
        update={"request_window_steps": 5, "request_plain_entry_steps": plain_per_entry}
    )  # (uncalibrated: the blend alone; calibrated, each task's drafted part is scaled)
    width = BatchWidth(spec, 16, 4)
    rates = {t: [rng.uniform(0.3, 0.95) for _ in range(15)] for t in Task}

    def learned(task: Task) -> dict[str, Any]:
        return {"accept_rates": rates[task], "accept_trials": (), "step_cost": None}

    requests = [Request(f"r{i}", list(Task)[i % 3]) for i in range(rows)]
    if is_caught_up:  # the same ids held shorter histories before
        for request in requests:
            request.ran(7, 3)
        _step(width, requests, learned)
        _step(width, requests, learned)
        requests = [Request(f"r{i}", list(Task)[(i + 1) % 3]) for i in range(rows)]
    for _ in range(30):
        if not is_caught_up:
            _step(width, requests, learned)
        for request in requests:
            k = rng.choice([0, 0, 0, 3, 7, 15])
            request.ran(k, rng.randint(1, k + 1))
    slots = _ingest(width, requests)
    want = [0.0] * 16
    for request in requests:
        ks, lengths = request_window(
            request.spec_tokens, request.accept_lengths, 5, plain_per_entry
        )
        assert len(ks) == 5
        blended = blend_request_history(rates[request.task], ks, lengths, 6.0)
        want = [w + e for w, e in zip(want, expected_by_k(blended), strict=True)]
    got, _ = width._expected_totals(slots, [15] * rows)
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("plain_per_entry", [1, 3, 8])
def test_windows_read_every_few_steps_equal_windows_read_every_step(plain_per_entry: int) -> None:
    """The step controller may decide only every few steps (host-bound engines): the rows'
    windows then take several steps at once and must hold exactly what step-by-step reading
    holds, rows that joined or left in between included, and so must a row's count of plain
    steps toward its next window entry."""
    rng = random.Random(5)
    spec = GoodputSpec(
        probe_probability=0.0, hysteresis=0.0, request_plain_entry_steps=plain_per_entry
    )
    every, spaced = BatchWidth(spec, 16, 4), BatchWidth(spec, 16, 4)
    rows: dict[str, tuple[Task, list[int], list[int]]] = {}
    learned = Learned({Task.MATH: 0.8, Task.CODE: 0.7, Task.CHAT: 0.5}, 16)
    for step in range(120):
        if step % 9 == 0 or not rows:  # a request joins
            rows[f"r{step}"] = (rng.choice(list(Task)), [], [])
        if step % 13 == 5 and len(rows) > 1:  # one leaves
            rows.pop(next(iter(rows)))
        batch = [StepRow(rid, task, lengths, ks, 15) for rid, (task, lengths, ks) in rows.items()]
        every.decide(batch, learned)
        if step % 4 == 3:
            spaced.decide(batch, learned)
            for rid in rows:
                a = every.windows._slot_of[rid]
                b = spaced.windows._slot_of[rid]
                assert spaced.windows.counts[b] == pytest.approx(every.windows.counts[a])
                assert spaced.windows._idle[b] == every.windows._idle[a], (step, rid)
        for _, lengths, ks in rows.values():
            k = rng.choice((0, 0, 0, 4, 7, 15))
            ks.append(k)
            lengths.append(rng.randint(0, k) + 1)


def _run_batch_of_one(
    width: BatchWidth, models: OnlineModels, rate: float, steps: int, rng: random.Random
) -> list[int]:
    """``steps`` engine steps of one math row at a time (a fresh request every 100 steps),
    each drafted position accepted with ``rate``; every step recorded, plain ones too."""
    ks = []
    for step in range(steps):
        if step % 100 == 0:
            request = Request(f"r{rng.random()}", Task.MATH)
        k = _step(width, [request], models.observe)
        accepted = 0
        while accepted < k and rng.random() < rate:
            accepted += 1
        request.ran(k, accepted + 1)
        models.record_steps(Task.MATH, [k], [accepted + 1])
        ks.append(k)
    return ks


def test_a_task_that_stopped_drafting_starts_again_when_its_text_gets_easier() -> None:
    """Session 36's real pair: math turned drafting off on hard first requests and never
    drafted again, though later requests accepted well. Plain steps now age the task's
    evidence (``plain_step_age``), so it drifts back and the easier text turns drafting on
    again (with 0, as before: 0 of the last 1,000 steps drafted). What that costs on text
    that stays hard: the estimate returns to break-even now and then, and a few percent of
    the steps draft (1.8% at the default 0.25, 6.7% at 1)."""
    spec = GoodputSpec()
    # Batch 1: a drafting step costs 1.5 plain steps, so drafting needs ~1.6 tokens a step.
    table = CostTable(
        batch_sizes=(1, 2),
        tokens_per_request=(1, 8, 16),
        step_time_s=((1e-3, 1.5e-3, 1.5e-3), (1e-3, 1.5e-3, 1.5e-3)),
    )
    models = OnlineModels(spec, 16, table)
    rng = random.Random(0)
    width = BatchWidth(spec, 16, 4, rng_u=rng.random)
    hard = _run_batch_of_one(width, models, 0.15, 8000, rng)
    assert sum(k > 0 for k in hard[-4000:]) < 0.05 * 4000  # hard text: drafting mostly off
    easy = _run_batch_of_one(width, models, 0.85, 3000, rng)
    assert sum(k > 0 for k in easy[-1000:]) > 950  # easy text: drafting on again


def _short_requests(
    width: BatchWidth,
    learned: Any,
    accept: float | Mapping[Task, float],
    steps: int,
    rng: random.Random,
    rows: int = 64,
    tasks: tuple[Task, ...] = (Task.CHAT,),
    emitted: list[int] | None = None,
) -> list[int]:
    """``steps`` decisions over a batch of ``rows`` short requests (replaced as they end; the
    row's task by turns from ``tasks``), each drafted position accepted with probability
    ``accept`` (per task when a mapping); the k of every step (each step's emitted tokens
    appended to ``emitted``)."""
    rates = accept if isinstance(accept, Mapping) else dict.fromkeys(tasks, accept)
    requests = [Request(f"r{i}", tasks[i % len(tasks)], remaining=12) for i in range(rows)]
    serial, ks = rows, []
    for _ in range(steps):
        k = _step(width, requests, learned, 8)
        ks.append(k)
        for i, request in enumerate(requests):
            run = min(k, request.remaining - 1)
            accepted = 0
            while accepted < run and rng.random() < rates[request.task]:
                accepted += 1
            request.ran(run, accepted + 1)
            if emitted is not None:
                emitted.append(accepted + 1)
            if request.remaining <= 1:
                requests[i] = Request(f"r{serial}", request.task, remaining=12)
                serial += 1
    return ks


def test_shared_calibration_checks_the_task_estimate_on_the_rows_it_drafted() -> None:
    """The task estimate says 0.9 a position (learnt from steps chosen because they looked
    easy); the rows, short requests with no history of their own, accept 0.35. Uncalibrated,
    every step drafts; calibrated, the decisions' own rows show the estimate is 4x too
    optimistic and drafting stops. When the text turns easy (0.95), the factor, aged by the
    plain steps, drifts back to 1 and drafting resumes."""
    spec = QUIET.model_copy(update={"shared_calibration": True})
    off, on = BatchWidth(QUIET, 8, 4), BatchWidth(spec, 8, 4)
    learned = Learned({t: 0.9 for t in Task}, block=8)
    learned.cost = FixedCost(narrow=2.5, wide=4.0)
    assert off.calibration == on.calibration == 1.0  # nothing seen yet
    ks_off = _short_requests(off, learned, 0.35, 200, random.Random(1))
    ks_on = _short_requests(on, learned, 0.35, 200, random.Random(1))
    assert sum(k > 0 for k in ks_off[-100:]) == 100
    assert sum(k > 0 for k in ks_on[-100:]) <= 10
    assert on.calibration < 0.5 and off.calibration == 1.0
    later = _short_requests(on, learned, 0.95, 1500, random.Random(2))
    assert sum(k > 0 for k in later[-200:]) >= 150
    assert on.calibration > 0.6


def test_shared_calibration_forgets_a_poor_start_on_its_own_memory() -> None:
    """Simulation (session 44): with the task estimates' memory the factor held one poor first
    step for hundreds of steps (steady math at 64 clients: the factor at its 0.25 floor,
    drafting off, -2.1%) while the task estimate had long learnt it. Its own, shorter memory
    (``calibration_half_life_steps``, 100 row-steps) lets it return once the rows realize what
    the estimate expects; the old one (3000) still holds it down."""
    factors = {}
    for half_life in (100.0, 3000.0):
        spec = QUIET.model_copy(
            update={"shared_calibration": True, "calibration_half_life_steps": half_life}
        )
        width = BatchWidth(spec, 8, 4)
        learned = Learned({t: 0.9 for t in Task}, block=8)
        learned.cost = FixedCost(narrow=2.5, wide=4.0)
        _short_requests(width, learned, 0.05, 2, random.Random(4))  # a poor start
        assert width.calibration < 0.5
        _short_requests(width, learned, 0.9, 150, random.Random(5))
        factors[half_life] = width.calibration
    assert factors[100.0] > 0.8 and factors[3000.0] < 0.6


def test_shared_calibration_leaves_a_right_estimate_alone() -> None:
    spec = QUIET.model_copy(update={"shared_calibration": True})
    width = BatchWidth(spec, 8, 4)
    learned = Learned({t: 0.6 for t in Task}, block=8)
    learned.cost = FixedCost(narrow=1.5, wide=2.0)
    ks = _short_requests(width, learned, 0.6, 300, random.Random(3))
    assert sum(k > 0 for k in ks[-100:]) == 100
    assert 0.85 < width.calibration < 1.15


def test_shared_calibration_counts_only_steps_that_ran_the_decided_k() -> None:
    """A step at another k (a probe's wider width, a two-phase step's per-row k from the
    draft's confidence) was not the decision's: it leaves the factor alone."""
    spec = QUIET.model_copy(update={"shared_calibration": True})
    width = BatchWidth(spec, 8, 4)
    learned = Learned({t: 0.5 for t in Task}, block=8)
    requests = [Request(f"r{i}", Task.MATH) for i in range(8)]
    k = _step(width, requests, learned, 8)
    assert k == 7
    for request in requests:
        request.ran(4, 5)  # another k, everything accepted
    _step(width, requests, learned, 8)
    assert width.calibration == 1.0
    k = _step(width, requests, learned, 8)
    for request in requests:
        request.ran(k, k + 1)  # the decided k, everything accepted: better than expected
    _step(width, requests, learned, 8)
    assert width.calibration > 1.0


def test_on_a_ragged_engine_every_k_is_a_candidate_and_priced_on_its_own() -> None:
    """An engine whose rows verify at their own widths hands its table with multiple 1: a step
    of k = 4 costs 5 tokens a row, not a padded 8, so a shared k of 4-6 can win where the
    padded candidates (0, 7, 15) could not (the real pair's 8-row chat phase on an H100, call
    s37c: static-k4 8,520 tok/s, static-k7 8,308, the shared k only 7 or 15)."""
    # 8 rows: each verified token a row costs 0.08 of a plain step.
    table = CostTable(
        batch_sizes=(1, 8, 64),
        tokens_per_request=(1, 2, 4, 8, 16),
        step_time_s=tuple(
            tuple(1e-3 * (1.0 + b * 0.01 * (t - 1)) for t in (1, 2, 4, 8, 16)) for b in (1, 8, 64)
        ),
    )
    rates = {task: 0.55 for task in Task}  # a short run: most of it within 4 drafts
    chosen = {}
    for multiple in (8, 1):
        learned = Learned(rates, block=16)
        learned.cost = OnlineModels(QUIET, 16, table, multiple).step_cost()
        width = BatchWidth(QUIET, 16, min_spec_tokens=4)
        chosen[multiple] = _step(width, [Request(f"r{i}", Task.CHAT) for i in range(8)], learned)
    assert chosen[8] in (0, 7, 15)
    assert 4 <= chosen[1] < 7  # priced at its own width, a narrower k wins
    # The expected rate at the chosen k beats the padded choice's under the ragged prices.
    cost = OnlineModels(QUIET, 16, table, 1).step_cost()
    assert cost is not None
    expected = expected_by_k([0.55] * 15)
    rate = {k: expected[k] / cost.step_time_s(8, k) for k in (chosen[1], chosen[8])}
    assert rate[chosen[1]] > rate[chosen[8]]


def test_probes_on_a_ragged_engine_still_step_by_the_policys_captured_width() -> None:
    """Probes observe the positions past the chosen k a whole captured width at a time: from a
    narrow k on a ragged engine the probe verifies k = 7, not one position more."""
    table = CostTable(
        batch_sizes=(1, 8), tokens_per_request=(1, 16), step_time_s=((1e-3, 1.3e-3), (1e-3, 2e-3))
    )
    spec = GoodputSpec(probe_probability=1.0, probe_min_steps=1e9, hysteresis=0.0)
    learned = Learned({task: 0.55 for task in Task}, block=16, trials=1.0)
    learned.cost = OnlineModels(spec, 16, table, 1).step_cost()
    width = BatchWidth(spec, 16, min_spec_tokens=4, rng_u=lambda: 0.0)
    k = _step(width, [Request("r", Task.CHAT)], learned)
    assert width.last[0] == "probe" and k == 7
    assert 4 <= width._decided < 7  # the decision itself: a narrow k


@pytest.mark.parametrize("plain_per_entry", [1, 3, 8])
def test_a_row_that_showed_drafting_loses_stays_plain_longer_than_its_window(
    plain_per_entry: int,
) -> None:
    """Call s42c (the real pair, H100): math requests at batch 1 accepted ~1.9 a step where
    the task estimate, learnt from other phases' math, said 2.7; each went plain once its
    window showed it, and drafted again as soon as 32 plain steps had pushed that out: 16% of
    the phase's steps drafted at a loss. With every 3 plain steps one window entry
    (``request_plain_entry_steps``, the default), what the row showed holds 3x longer."""
    shares = {}
    for calibrated in (False, True):
        spec = GoodputSpec(
            probe_probability=0.0,
            hysteresis=0.0,
            request_plain_entry_steps=plain_per_entry,
            shared_calibration=calibrated,
        )
        learned = Learned({Task.MATH: 0.7}, 16)  # the task's estimate: drafting pays
        learned.cost = FixedCost(2.45, 2.45)  # drafting needs 2.45 tokens a step
        width = BatchWidth(spec, 16, 4)
        rng = random.Random(3)
        request = Request("r0", Task.MATH)
        drafted = 0
        for _ in range(3000):
            k = _step(width, [request], learned)
            accepted = 0
            while accepted < k and rng.random() < 0.35:  # this request's text: ~1.5 a step
                accepted += 1
            request.ran(k, accepted + 1)
            drafted += k > 0
        shares[calibrated] = drafted / 3000
    share = shares[False]
    if plain_per_entry == 1:  # (22.5% with this seed)
        assert share > 0.15
    elif plain_per_entry == 3:  # (8.6%: each return takes ~3x as many plain steps)
        assert share < 0.12
    else:  # (2.9%)
        assert share < 0.04
    # ``shared_calibration`` (the default since session 48): the row's drafted steps also
    # lower the task's factor, which plain steps age slowly, so each return drafts less
    # (2.3 / 1.5 / 1.2% at 1 / 3 / 8)
    assert shares[True] < 0.03


@pytest.mark.parametrize("plain_per_entry", [3, 8])
def test_a_row_whose_hard_opening_gives_way_to_easy_text_drafts_again(
    plain_per_entry: int,
) -> None:
    """Call s43a (the real pair, H100): two math requests at batch 1 accepted ~1.5 a step
    for their first 44 tokens and ~3 after; with every 8 plain steps one window entry they
    went plain at token 44 and stayed plain for 256 steps (the phase 0.915x static k = 7).
    With 3 (the default) the row drafts again after ~96 plain steps."""
    spec = GoodputSpec(
        probe_probability=0.0, hysteresis=0.0, request_plain_entry_steps=plain_per_entry
    )
    learned = Learned({Task.MATH: 0.7}, 16)
    learned.cost = FixedCost(2.45, 2.45)  # drafting needs 2.45 tokens a step
    width = BatchWidth(spec, 16, 4)
    rng = random.Random(5)
    request = Request("r0", Task.MATH)
    tokens = 0
    while tokens < 400:
        k = _step(width, [request], learned)
        rate = 0.35 if tokens < 44 else 0.8  # hard opening, then easy text
        accepted = 0
        while accepted < k and rng.random() < rate:
            accepted += 1
        request.ran(k, accepted + 1)
        tokens += accepted + 1
    ks = "".join("d" if k else "p" for k in request.spec_tokens)
    stretch = ks.lstrip("d").index("d")  # the first plain stretch, in steps
    assert ks.startswith("d") and ks.endswith("d" * 30)  # drafts again, for good
    if plain_per_entry == 3:
        assert stretch <= 100  # (87: 32 window entries of 3 steps, less its drafted ones)
    else:
        assert stretch > 200  # (232)


@pytest.mark.parametrize("every", [0, 8])
def test_a_plain_batch_reprobes_and_drafts_again_once_its_text_turns_easy(every: int) -> None:
    """Call s43e (the real pair, H100): at 64 rows goodput's shared k went plain for 96 steps
    in every run, the rows' windows unchanged by plain steps, then drafted at 2.9-3.1 a row.
    With ``request_reprobe_steps`` a batch plain that long drafts one step at its best k while
    that k is within ``request_probe_margin`` of a plain step, and its rows' windows see the
    easier text: here it drafts again after 44 plain steps, not 84."""
    spec = QUIET.model_copy(update={"request_reprobe_steps": every})
    learned = Learned({Task.MATH: 0.7}, 16)
    learned.cost = FixedCost(2.45, 2.45)  # drafting needs 2.45 tokens a row a step
    width = BatchWidth(spec, 16, 4)
    rng = random.Random(2)
    rows = [Request(f"r{i}", Task.MATH) for i in range(8)]
    ks = []
    for step in range(200):
        k = _step(width, rows, learned)
        rate = 0.35 if step < 40 else 0.8  # a hard stretch, then easy text
        for row in rows:
            accepted = 0
            while accepted < k and rng.random() < rate:
                accepted += 1
            row.ran(k, accepted + 1)
        ks.append(k)
    plan = "".join("d" if k else "p" for k in ks)
    start = plan.index("p")
    back = plan.index("d" * 10, start)  # drafting for good again
    assert plan.endswith("d" * 100)
    if every:
        assert back - start < 60  # (44: a probe every 8 plain steps, the fifth one stays)
        assert all(len(run) == every for run in plan[start:back].split("d") if run)
    else:
        assert back - start > 80  # (84: the windows flushed by plain entries)
        assert "d" not in plan[start:back]


def _strength_run(spreads: tuple[float, float], seed: int, requests: int = 40) -> BatchWidth:
    """Math requests one at a time, each drafting k = 7 for 30 steps and accepting each draft
    with its own chance, drawn from ``spreads`` (low, high) around a task rate of 0.6."""
    rng = random.Random(seed)
    spec = GoodputSpec(request_strength_choices=[1, 2, 4, 8, 16, 64])
    width = BatchWidth(spec, 16, 4)
    learned = Learned({t: 0.6 for t in Task}, 16)
    for i in range(requests):
        p = rng.uniform(*spreads)
        request = Request(f"r{i}", Task.MATH)
        for _ in range(30):
            _step(width, [request], learned)
            length = 1
            while length <= 7 and rng.random() < p:
                length += 1
            request.ran(7, length)
    return width


def test_request_strength_is_learnt_from_how_much_requests_of_a_task_differ() -> None:
    """Requests that differ widely (each accepts 0.1-0.95 of its drafts) make a request's own
    steps the better predictor: a small strength; requests alike (0.58-0.62, the task rate)
    leave the task estimate the better one: a large strength. Other tasks, unseen, keep the
    fixed ``request_prior_strength``."""
    apart = _strength_run((0.1, 0.95), seed=1).strength_chooser
    alike = _strength_run((0.58, 0.62), seed=1).strength_chooser
    assert apart is not None and alike is not None
    view_apart, view_alike = apart.view(), alike.view()
    assert view_apart["math"]["strength"] <= 2
    assert view_alike["math"]["strength"] >= 16
    assert view_apart["chat"]["strength"] == GoodputSpec().request_prior_strength
    assert view_apart["math"]["scored_steps"] > 500


def test_a_learnt_strength_blends_as_the_policy_blend_does() -> None:
    """Once learnt, each row's expectation is ``blend_request_history`` at its task's strength."""
    width = _strength_run((0.1, 0.95), seed=2, requests=10)
    chooser = width.strength_chooser
    assert chooser is not None
    strength = float(chooser.strengths[list(Task).index(Task.MATH)])
    request = Request("last", Task.MATH)
    learned = Learned({t: 0.6 for t in Task}, 16)
    for length in (1, 2, 1, 8, 3):
        _step(width, [request], learned)
        request.ran(7, length)
    slots = width.windows.ingest(
        [request.row_id], [request.task], [request.accept_lengths], [request.spec_tokens]
    )
    blended = blend_request_history(
        [0.6] * 15, request.spec_tokens, request.accept_lengths, strength
    )
    assert width._expected_totals(slots, [15])[0] == pytest.approx(expected_by_k(blended), rel=1e-9)


def test_request_strength_choices_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        GoodputSpec(request_strength_choices=[2, 0])
    assert GoodputSpec(request_strength_choices=[8, 2, 2]).request_strength_choices == [2, 8]
    assert BatchWidth(GoodputSpec(), 16, 4).strength_chooser is None


def test_calibration_by_task_narrows_only_the_task_the_estimates_overstate() -> None:
    """Half the rows are code that accepts what the estimate says (0.9 a position), half chat
    that accepts 0.1 against the same 0.9. One factor for every row (the real pair's chat
    phase, s45c) halves code's expectation too and the batch mostly runs plain; a factor per
    task keeps code's near 1, drops chat's to its floor, and the batch emits more tokens per
    priced second than with one factor or none."""
    accept = {Task.CODE: 0.9, Task.CHAT: 0.1}
    goodput, factors = {}, {}
    for name, update in (
        ("off", {}),
        ("one", {"shared_calibration": True, "calibration_by_task": False}),
        ("task", {"shared_calibration": True}),
    ):
        width = BatchWidth(QUIET.model_copy(update=update), 8, 4)
        learned = Learned({t: 0.9 for t in Task}, block=8)
        learned.cost = cost = FixedCost(narrow=3.0, wide=5.0)
        emitted: list[int] = []
        ks = _short_requests(
            width, learned, accept, 300, random.Random(2), 8, (Task.CODE, Task.CHAT), emitted
        )
        goodput[name] = sum(emitted) / sum(cost.step_time_s(8, k) for k in ks)
        factors[name] = dict(zip(TASKS, width.calibrations.tolist(), strict=True))
    assert factors["one"][Task.CODE] == factors["one"][Task.CHAT] < 0.7
    assert factors["task"][Task.CODE] > 0.85 and factors["task"][Task.CHAT] < 0.3
    assert goodput["task"] > 1.02 * goodput["one"] > 1.02 * goodput["off"]


def test_a_tie_at_a_requests_end_goes_to_the_wider_k() -> None:
    """Every k from a row's ceiling up runs the same step, so they tie. The narrower one,
    decided for a request about to end, was held by the hysteresis for the wide-open request
    after it (8B arm, s48c: k 14 for a whole math phase where 15 paid 2% more)."""
    learned = Learned({t: 0.95 for t in Task}, block=16)
    learned.cost = CostModel(
        TABLE, block_size=16, verify_width_multiple=1, draft_cost_fraction=0.16
    ).snapshot()
    width = BatchWidth(QUIET.model_copy(update={"hysteresis": 0.03}), 16, 4)
    assert _step(width, [Request("ending", Task.MATH, remaining=15)], learned) == 15  # ceiling 14
    assert _step(width, [Request("fresh", Task.MATH)], learned) == 15


@pytest.mark.parametrize("by_task", [True, False])
def test_the_calibrations_two_tallies_agree(by_task: bool) -> None:
    """``_calibrate`` tallies a few row-steps in plain Python and many with numpy: on the same
    steps (drafted at the decided k, at another k, plain; three tasks) both give the same
    ages, accepted and expected drafts per group."""
    spec = QUIET.model_copy(
        update={
            "shared_calibration": True,
            "calibration_by_task": by_task,
            "request_plain_entry_steps": 1,
        }
    )
    width = BatchWidth(spec, 8, 4)
    learned = Learned({t: 0.7 for t in Task}, block=8)
    learned.cost = FixedCost(narrow=1.2, wide=1.6)
    rng = random.Random(5)
    requests = [Request(f"r{i}", list(Task)[i % 3]) for i in range(6)]
    k = 0
    for step in range(16):
        if step < 12:  # the last four steps run on a held decision: several new steps a row
            k = _step(width, requests, learned, 8)
        for request in requests:
            ran = rng.choice([0, k, k, 3]) if step % 4 else k  # some off the decided k
            request.ran(ran, rng.randint(1, ran + 1))
    slots = _ingest(width, requests)
    rows, ks, lengths = width.windows.last_new
    assert len(rows) == len(slots) and ks.shape == (6, 5)  # the last decided step, 4 held
    groups = 3 if by_task else 1
    ks = np.minimum(ks, 7)
    few = width._tally_few(rows, ks, lengths, groups)
    many = width._tally_many(rows, ks, lengths, groups)
    for a, b in zip(few, many, strict=True):
        assert a == pytest.approx(b)
    assert sum(few[0]) > 0 and sum(few[1]) > 0


# ``drain_makespan``: a draining batch is judged by when its longest row finishes.
DRAIN = QUIET.model_copy(update={"drain_makespan": True})


def _drain_batch(long_task: Task) -> tuple[list[Request], Learned]:
    """Four math rows (accept 0.9 a position) with 20 tokens left and one row of
    ``long_task`` with 200; drafting at k = 15 costs 2x a plain step."""
    learned = Learned({Task.MATH: 0.9, Task.CHAT: 0.3, Task.CODE: 0.9}, block=16)
    learned.cost = FixedCost(narrow=1.5, wide=2.0)
    short = [Request(f"m{i}", Task.MATH, remaining=20) for i in range(4)]
    return [*short, Request("long", long_task, remaining=200)], learned


def _decide(width: BatchWidth, requests: list[Request], learned: Learned) -> int:
    rows = [r.row(16) for r in requests]
    return width.decide(rows, learned, [r.remaining for r in requests])


def test_a_batch_drains_once_rows_have_left_and_none_joined_for_a_few_decisions() -> None:
    requests, learned = _drain_batch(Task.CHAT)
    width = BatchWidth(DRAIN, 16, 4)
    seen = []
    # a long stretch without joins, then a row leaves: draining from the next decision
    for batch in (requests, requests, requests, requests[1:], requests[1:], requests[2:]):
        _decide(width, batch, learned)
        seen.append(width.draining)
    assert seen == [False, False, False, False, True, True]
    newcomer = Request("new", Task.MATH, remaining=20)
    _decide(width, [*requests[2:], newcomer], learned)  # a row joins: not a drain any more
    assert not width.draining
    _decide(width, [*requests[3:], newcomer], learned)  # one leaves and is replaced a call on
    _decide(width, [*requests[3:], newcomer, Request("next", Task.MATH)], learned)
    assert not width.draining


def test_a_draining_batch_stays_plain_when_drafting_slows_its_longest_row() -> None:
    requests, learned = _drain_batch(Task.CHAT)  # the long row accepts ~1.4 a step
    width, throughput = BatchWidth(DRAIN, 16, 4), BatchWidth(QUIET, 16, 4)
    for batch in (requests, requests, requests[1:], requests[1:]):
        ks = _decide(width, batch, learned), _decide(throughput, batch, learned)
    # tokens a second say draft (the math rows' ~8 tokens a step at 2x the time); the chat
    # row, which finishes last, would emit ~1.4 tokens in 2x a plain step's time
    assert ks == (0, 15)
    assert width.reason.startswith("batch[drain] B=4 k=0")
    # its best drafting k by the drain's score (k = 7: the chat row runs its 1.4 tokens in
    # 1.5x a plain step there, not 2x), recorded for the harness in tokens a second
    totals = width.last_totals
    assert width.last_drafting == pytest.approx((7, totals[7] / 1.5 / totals[0], 1.0, 1.5))


def test_a_draining_batch_drafts_when_its_longest_row_gains_and_reads_no_rooms_off() -> None:
    requests, learned = _drain_batch(Task.MATH)
    width = BatchWidth(DRAIN, 16, 4)
    for batch in (requests, requests, requests[1:], requests[1:]):
        k = _decide(width, batch, learned)
    assert width.draining and k == 15  # 200 tokens at ~8 a step: 49 step times, not 200
    # the rule off, or no rooms told: the batch's tokens a second, whatever it drains
    assert BatchWidth(DRAIN, 16, 4).reads_rooms and not BatchWidth(QUIET, 16, 4).reads_rooms
    requests, learned = _drain_batch(Task.CHAT)
    blind = BatchWidth(DRAIN, 16, 4)
    for batch in (requests, requests, requests[1:], requests[1:]):
        k = blind.decide([r.row(16) for r in batch], learned)
    assert blind.draining and k == 15 and blind.reason.startswith("batch[best]")


def test_finishing_rates_follow_the_row_with_the_most_steps_left() -> None:
    from policies.batch_width import _finishing_rates

    per_row = np.array([[1.0, 2.0, 4.0], [1.0, 1.0, 1.5]])
    rates = _finishing_rates(per_row, [100, 30])
    # k = 0: 100 steps; k = 1: max(50, 30); k = 2: max(25, 20)
    assert rates.tolist() == pytest.approx([1 / 100, 1 / 50, 1 / 25])
    # rooms below a token count as one: the slower row, 1.5 tokens a step at k = 2
    assert _finishing_rates(per_row, [0, 0]).tolist() == pytest.approx([1.0, 1.0, 1.5])
