"""BatchWidth: one k per engine step for a padded batch, decided on the step's first call."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from policies.acceptance import blend_request_history, expected_by_k
from policies.batch_width import BatchWidth, RowWindow
from policies.costmodel import CostModel, CostTable
from policies.model import GoodputSpec
from policies.types import Task

# Shaped like the measured Qwen3-8B H200 table: width 8 ~1.16x a plain step at batch 1, ~1.9x
# at 64; width 16 ~3.3x at 64.
TABLE = CostTable(
    batch_sizes=(1, 8, 64),
    tokens_per_request=(1, 8, 16),
    step_time_s=((7.5e-3, 8.7e-3, 8.7e-3), (8.4e-3, 9.0e-3, 9.7e-3), (11.5e-3, 22e-3, 37.8e-3)),
)
Rows = list[tuple[str, Task, list[int]]]
QUIET = GoodputSpec(probe_probability=0.0, hysteresis=0.0)


class Learned:
    """OnlineModels.observe stand-in: fixed rates per task, counts its calls."""

    def __init__(self, rates: Mapping[Task, float], block: int, trials: float = 1e6):
        self.rates = dict(rates)
        self.block = block
        self.trials = trials
        self.calls = 0
        self.cost = CostModel(TABLE, block_size=block, draft_cost_fraction=0.16).snapshot()

    def __call__(self, task: Task) -> dict[str, Any]:
        self.calls += 1
        n = self.block - 1
        return {
            "accept_rates": (self.rates[task],) * n,
            "accept_trials": (self.trials,) * n,
            "step_cost": self.cost,
        }


def _step(width: BatchWidth, rows: Rows, learned: Learned) -> list[int]:
    return [width.spec_tokens(rid, t, len(rows), h, learned) for rid, t, h in rows]


def test_every_row_of_a_step_gets_the_one_k_decided_on_its_first_call() -> None:
    learned = Learned({Task.MATH: 0.8, Task.CHAT: 0.8, Task.CODE: 0.8}, block=16)
    width = BatchWidth(QUIET, 16, min_spec_tokens=4, rng_u=lambda: 1.0)
    rows: Rows = [(f"r{i}", Task.MATH if i % 2 else Task.CHAT, []) for i in range(8)]
    ks = _step(width, rows, learned)
    assert len(set(ks)) == 1 and ks[0] in (7, 15)
    assert width.steps == 1 and learned.calls == 1  # one task, read once, at the step start
    _step(width, rows, learned)
    assert width.steps == 2 and learned.calls == 1 + 2  # both tasks of the previous step


def test_a_row_asked_twice_starts_a_new_step_even_before_the_batch_is_complete() -> None:
    learned = Learned({t: 0.8 for t in Task}, block=8)
    width = BatchWidth(QUIET, 8, 4)
    width.spec_tokens("a", Task.MATH, 3, [], learned)
    width.spec_tokens("a", Task.MATH, 3, [2], learned)  # "b" and "c" finished meanwhile
    assert width.steps == 2


def test_load_and_acceptance_decide_whether_the_batch_drafts() -> None:
    # Easy text drafts at every load; harder text only when the verify is cheap (batch 1).
    cases = ((0.8, 1, True), (0.8, 64, True), (0.45, 1, True), (0.45, 64, False))
    for rate, batch, expect_drafting in cases:
        learned = Learned({t: rate for t in Task}, block=8)
        width = BatchWidth(QUIET, 8, 4)
        ks = _step(width, [(f"r{i}", Task.MATH, []) for i in range(batch)], learned)
        assert (ks[0] > 0) is expect_drafting, (rate, batch, ks[0])


def test_rows_own_steps_move_the_shared_choice() -> None:
    # The task says drafting pays at batch 64; every row then rejects its first draft token.
    learned = Learned({t: 0.7 for t in Task}, block=8)
    width = BatchWidth(QUIET, 8, 4)
    rows: Rows = [(f"r{i}", Task.CODE, []) for i in range(64)]
    assert _step(width, rows, learned)[0] == 7
    ks: list[int] = []
    for _ in range(12):
        for _, _, history in rows:
            history.append(1)  # accept length 1: nothing accepted
        ks = _step(width, rows, learned)
    assert ks[0] == 0


def test_hysteresis_keeps_the_previous_k_inside_its_margin() -> None:
    learned = Learned({t: 0.6 for t in Task}, block=8)
    rows: Rows = [(f"r{i}", Task.CHAT, []) for i in range(40)]
    free = BatchWidth(QUIET, 8, 4)
    sticky = BatchWidth(QUIET.model_copy(update={"hysteresis": 0.5}), 8, 4)
    assert _step(free, rows, learned)[0] == _step(sticky, rows, learned)[0]
    learned.rates = {t: 0.45 for t in Task}  # drafting now loses, by ~3%
    assert _step(free, rows, learned)[0] == 0
    assert _step(sticky, rows, learned)[0] == 7


def test_probe_one_width_wider_while_those_positions_lack_trials() -> None:
    spec = GoodputSpec(probe_probability=0.5, probe_min_trials=100, hysteresis=0.0)
    rows: Rows = [(f"r{i}", Task.MATH, []) for i in range(64)]
    few = Learned({t: 0.8 for t in Task}, block=16, trials=10)
    width = BatchWidth(spec, 16, 4, rng_u=lambda: 0.1)
    assert _step(width, rows, few)[0] == 15  # chose 7 at batch 64, probed width 16
    assert "probe" in width.reason
    many = Learned({t: 0.8 for t in Task}, block=16, trials=1000)
    assert _step(BatchWidth(spec, 16, 4, rng_u=lambda: 0.1), rows, many)[0] == 7
    assert _step(BatchWidth(spec, 16, 4, rng_u=lambda: 0.9), rows, few)[0] == 7


def test_rows_that_left_the_batch_are_forgotten() -> None:
    learned = Learned({t: 0.7 for t in Task}, block=8)
    width = BatchWidth(QUIET, 8, 4)
    _step(width, [("a", Task.MATH, []), ("b", Task.MATH, [])], learned)
    _step(width, [("a", Task.MATH, [2])], learned)
    _step(width, [("a", Task.MATH, [2, 2])], learned)
    assert "b" not in width._rows and set(width._asked) == {"a"}


@pytest.mark.parametrize("rows", [3, 40])  # the Python loop and the numpy pass
def test_expected_sum_matches_the_policy_blend(rows: int) -> None:
    rng = random.Random(rows)
    spec = GoodputSpec(request_window_steps=5)
    width = BatchWidth(spec, 16, 4)
    rates = {t: [rng.uniform(0.3, 0.95) for _ in range(15)] for t in Task}
    batch, want = [], [0.0] * 16
    for i in range(rows):
        task = list(Task)[i % 3]
        ks = [rng.choice([0, 7, 15]) for _ in range(rng.randint(0, 9))]
        lengths = [rng.randint(1, k + 1) for k in ks]
        window = RowWindow(5, 15)
        for k, n in zip(ks, lengths, strict=True):
            window.add(k, n)
        batch.append(_row(task, window))
        drafted = [(k, n) for k, n in zip(ks, lengths, strict=True) if k > 0][-5:]
        blended = blend_request_history(
            rates[task], [k for k, _ in drafted], [n for _, n in drafted], 6.0
        )
        want = [w + e for w, e in zip(want, expected_by_k(blended), strict=True)]
    got = width._expected_sum(batch, rates)
    assert got == pytest.approx(want, rel=1e-9)


def _row(task: Task, window: RowWindow) -> Any:
    from policies.batch_width import _Row

    return _Row(task, window)
