"""The per-slot allocator of a ragged step (issue 16): survival from the task prior, the
request's own history and the calibrated draft confidence; vLLM's budget rule over it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from policies.baselines.vllm_av import VllmAdaptiveVerification, VllmAvSettings
from policies.slot_allocator import AllocatorSettings, SlotAllocator
from policies.types import TASK_INDEX, StepRow, Task

K = 15


class TokenCost:
    """B rows plus d drafts: ``per_draft`` seconds per draft on top of a 1 s step."""

    def __init__(self, per_draft: float):
        self.per_draft = per_draft

    def step_time_s(self, batch_size: int, num_draft_tokens: int) -> float:
        return 1.0 + self.per_draft * num_draft_tokens


def rates_of(table: dict[Task, float]):  # type: ignore[no-untyped-def]
    return lambda task: [table.get(task, 0.5)] * K


def allocator(per_draft: float = 0.01, min_k: int = 4) -> SlotAllocator:
    return SlotAllocator(AllocatorSettings(K, min_spec_tokens=min_k), TokenCost(per_draft))


def row(rid: str, task: Task, confidence: Sequence[float] | None = None, cap: int = K) -> StepRow:
    return StepRow(rid, task, [], [], cap, None if confidence is None else tuple(confidence))


def test_the_easier_task_gets_more_drafts_and_bounds_hold() -> None:
    rows = [row("m", Task.MATH), row("c", Task.CHAT), row("x", Task.CODE, cap=2)]
    choice = allocator().decide_rows(rows, 3, rates_of({Task.MATH: 0.9, Task.CHAT: 0.6}))
    math, chat, capped = choice.spec_tokens
    assert math > chat
    assert capped <= 2
    for k in choice.spec_tokens:
        assert k == 0 or 4 <= k <= K or k == capped
    assert "allocator: B=3" in choice.reason


def test_expensive_drafts_turn_drafting_off_and_cheap_ones_fill_the_block() -> None:
    rows = [row("m", Task.MATH)]
    rates = rates_of({Task.MATH: 0.9})
    assert allocator(per_draft=5.0).decide_rows(rows, 1, rates).spec_tokens == [0]
    assert allocator(per_draft=1e-4).decide_rows(rows, 1, rates).spec_tokens == [K]


def test_a_row_short_of_the_minimum_goes_up_or_to_zero() -> None:
    # Survival 0.5, 0.25, ...: the budget admits about two slots; with min 4 the row either
    # verifies 4 or nothing, never 1-3.
    for per_draft in (0.05, 0.2, 0.4, 0.8):
        k = allocator(per_draft=per_draft).decide_rows(
            [row("a", Task.CHAT)], 1, rates_of({Task.CHAT: 0.5})
        )
        assert k.spec_tokens[0] in (0, *range(4, K + 1)), (per_draft, k)


def test_the_calibration_learns_what_confidence_says_and_moves_the_allocation() -> None:
    """Confident slots (0.95) are always accepted, doubtful ones (0.2) always rejected: the
    calibration of the confident bin moves up, and a confident row then gets more drafts
    than a doubtful one of the same task."""
    policy = allocator(per_draft=0.02)
    rates = rates_of({Task.CHAT: 0.6})
    history: dict[str, tuple[list[int], list[int]]] = {"hi": ([], []), "lo": ([], [])}
    for step in range(200):
        rows = [
            StepRow(f"hi{step}", Task.CHAT, history["hi"][0], history["hi"][1], K, (0.95,) * K),
            StepRow(f"lo{step}", Task.CHAT, history["lo"][0], history["lo"][1], K, (0.2,) * K),
        ]
        ks = policy.decide_rows(rows, 2, rates).spec_tokens
        # the outcome of this step arrives with the next call, on the same row ids
        hi = StepRow(f"hi{step}", Task.CHAT, [ks[0] + 1], [ks[0]], K, (0.95,) * K)
        lo = StepRow(f"lo{step}", Task.CHAT, [1], [ks[1]], K, (0.2,) * K)
        policy._learn([hi, lo])
        policy._scored = None
    learnt, weight = policy.calibration()
    calibration = (learnt * weight)[list(Task).index(Task.CHAT)]
    assert calibration.max() > 0.5  # the confident bin learnt that it is always accepted
    assert calibration.min() <= 0  # the doubtful one (cold trust already drafts it little)
    fresh = [row("a", Task.CHAT, (0.95,) * K), row("b", Task.CHAT, (0.2,) * K)]
    ks = policy.decide_rows(fresh, 2, rates).spec_tokens
    assert ks[0] > ks[1]


def test_a_request_that_keeps_accepting_gets_more_than_its_task_prior() -> None:
    rates = rates_of({Task.CHAT: 0.6})
    good = StepRow("g", Task.CHAT, [8] * 12, [7] * 12, K)  # every draft accepted
    bad = StepRow("b", Task.CHAT, [1] * 12, [7] * 12, K)  # none accepted
    ks = allocator(per_draft=0.03).decide_rows([good, bad], 2, rates).spec_tokens
    assert ks[0] > ks[1]


def _history_run(
    alloc: SlotAllocator, rates_by_request: dict[str, float], steps: int, device: bool = False
) -> None:
    """``steps`` steps of chat requests whose drafts each accept with the request's own rate
    (no confidence), every row verifying k = 7; on the host (decide_rows, whose learning
    reads the rows' histories) or the device path (device_scoring, then observed)."""
    rng = np.random.default_rng(1)
    rates = rates_of({Task.CHAT: float(np.mean(list(rates_by_request.values())))})
    history: dict[str, tuple[list[int], list[int]]] = {r: ([], []) for r in rates_by_request}
    for _ in range(steps):
        rows = [StepRow(r, Task.CHAT, h[0], h[1], 7) for r, h in history.items()]
        if device:
            _, scoring = alloc.device_scoring(rows, len(rows), rates, [None] * len(rows))
        else:
            alloc.decide_rows(rows, len(rows), rates)
        lengths = []
        for r, (done, ks) in history.items():
            accepted = int(np.argmin(rng.uniform(size=8) < rates_by_request[r]))
            done.append(1 + min(accepted, 7))
            ks.append(7)
            lengths.append(done[-1])
        if device:
            alloc.observed(scoring, [None] * len(rows), [7] * len(rows), lengths)


@pytest.mark.parametrize("device", [False, True])
def test_the_recency_weight_grows_where_history_predicts_and_not_where_it_does_not(
    device: bool,
) -> None:
    """b starts at 0 here: requests of one task with different rates teach it that a
    request's recent steps predict its next (b > 0); requests of one rate do not."""
    settings = AllocatorSettings(K, recency_weight_start=0.0)
    mixed = SlotAllocator(settings, TokenCost(0.01))
    _history_run(mixed, {f"r{i}": (0.95 if i % 2 else 0.3) for i in range(16)}, 80, device)
    alike = SlotAllocator(settings, TokenCost(0.01))
    _history_run(alike, {f"r{i}": 0.6 for i in range(16)}, 80, device)
    learnt, unmoved = mixed.recency_weights(), alike.recency_weights()
    assert learnt["chat"] > 1.0 and learnt["math"] == learnt["code"] == 0.0  # no rows of theirs
    assert abs(unmoved["chat"]) < 0.5 * learnt["chat"]


def test_the_recency_feature_is_the_recent_surplus_over_the_prior() -> None:
    alloc = allocator()
    rates = rates_of({Task.CHAT: 0.5})
    fresh = StepRow("f", Task.CHAT, [], [], K)
    full = StepRow("g", Task.CHAT, [8] * 3, [7] * 3, K)  # every draft of k = 7 accepted
    none = StepRow("b", Task.CHAT, [1] * 3, [7] * 3, K)
    # all, all, then none: the newest step weighs most (weights 1/4, 1/2, 1)
    turned = StepRow("t", Task.CHAT, [8, 8, 1], [7, 7, 7], K)
    x = alloc.prepare_step([fresh, full, none, turned], 4, rates).recency
    expected = sum(0.5**j for j in range(1, 8))  # the prior's mean accepted of k = 7
    assert x[0] == 0.0
    assert x[1] == pytest.approx((7 - expected) / K)
    assert x[2] == pytest.approx(-expected / K)
    assert x[3] == pytest.approx((0.75 * (7 - expected) - expected) / 1.75 / K)
    assert x[2] < x[3] < x[1]
    # recency off: the fixed offset, and x plays no part
    off = SlotAllocator(AllocatorSettings(K, recency_decay=0.0), TokenCost(0.01))
    prepared = off.prepare_step([fresh, full], 2, rates)
    assert prepared.base_logit[1, 0] > prepared.base_logit[0, 0]


def test_vllm_av_on_a_ragged_engine_allocates_per_row() -> None:
    class Flat:
        def step_time_s(self, batch_size: int, spec_tokens: int) -> float:
            return 1.0 + 0.01 * batch_size * spec_tokens

    class Ragged:
        def step_time_s(self, batch_size: int, num_draft_tokens: int) -> float:
            return 1.0 + 0.01 * num_draft_tokens

    policy = VllmAdaptiveVerification(VllmAvSettings(K), Flat(), Ragged())
    rows = [
        StepRow("a", Task.MATH, (), (), K, (0.99,) * K),
        StepRow("b", Task.MATH, (), (), K, (0.01,) * K),
    ]
    choice = policy.decide_rows(rows, 2)
    assert choice.spec_tokens[0] > choice.spec_tokens[1]
    assert "budget=" in choice.reason


@pytest.mark.parametrize(
    "bad", [dict(max_spec_tokens=0), dict(max_spec_tokens=4, min_spec_tokens=5)]
)
def test_settings_refuse_impossible_bounds(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="spec_tokens"):
        AllocatorSettings(**bad)


def test_survival_is_non_increasing_along_the_block() -> None:
    policy = allocator()
    rng = np.random.default_rng(0)
    rows = [row(str(i), Task.CODE, tuple(rng.uniform(0.01, 0.99, K))) for i in range(8)]
    survival = policy._survival(rows, rates_of({Task.CODE: 0.8}), use_confidence=True)[0]
    assert (np.diff(survival, axis=1) <= 1e-12).all()


def test_a_step_prepared_before_the_confidence_decides_what_decide_rows_does() -> None:
    """``prepare_step`` (run while the device drafts) then ``finish_step`` with the draft's
    confidence gives every step the same k and the same learning as ``decide_rows``."""
    one, two = allocator(), allocator()
    rng = np.random.default_rng(3)
    histories: dict[str, tuple[list[int], list[int]]] = {str(i): ([], []) for i in range(12)}
    rates = rates_of({Task.MATH: 0.85, Task.CODE: 0.8, Task.CHAT: 0.6})
    tasks = [Task.MATH, Task.CODE, Task.CHAT]
    for step in range(40):
        rows = [
            StepRow(
                rid,
                tasks[int(rid) % 3],
                lengths,
                ks,
                K if step % 7 else 5,
                None if int(rid) == 4 else tuple(rng.uniform(0.01, 0.99, K)),
            )
            for rid, (lengths, ks) in histories.items()
        ]
        drafted = np.array([int(r.row_id) != 7 or step % 2 == 0 for r in rows])
        whole = one.decide_rows(rows, len(rows), rates, drafted)
        prepared = two.prepare_step(
            [r._replace(draft_confidence=None) for r in rows], len(rows), rates, drafted
        )
        split = two.finish_step(prepared, [r.draft_confidence for r in rows])
        assert split == whole, step
        for (lengths, ks), k in zip(histories.values(), whole.spec_tokens, strict=True):
            ks.append(k)
            lengths.append(int(rng.integers(0, k + 1)) + 1)
    for a, b in zip(one.calibration(), two.calibration(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_device_scoring_is_the_allocators_own_survival() -> None:
    """``slot_scoring`` hands the device the allocator's survival for rows whose every slot has
    a confidence, learnt calibration included."""
    from policies.slot_scoring import survival

    alloc = allocator()
    rng = np.random.default_rng(4)
    rates = rates_of({Task.MATH: 0.85, Task.CHAT: 0.55, Task.CODE: 0.7})
    tasks = (Task.MATH, Task.CHAT, Task.CODE)
    histories: dict[str, tuple[list[int], list[int]]] = {f"r{i}": ([], []) for i in range(6)}
    for _ in range(30):  # learn: calibration and own-history offsets away from zero
        rows = [
            StepRow(rid, tasks[i % 3], lengths, ks, K, tuple(rng.uniform(0, 1, K)))
            for i, (rid, (lengths, ks)) in enumerate(histories.items())
        ]
        choice = alloc.decide_rows(rows, 6, rates)
        for (lengths, ks), k in zip(histories.values(), choice.spec_tokens, strict=True):
            ks.append(k)
            lengths.append(1 + int(rng.integers(0, k + 1)))
    assert np.abs(alloc.calibration()[0]).max() > 0.05
    prepared = alloc.prepare_step(rows, 6, rates)
    confidence = rng.uniform(0, 1, (6, K))
    expected = alloc._calibrated(
        prepared.tasks,
        prepared.base_logit,
        confidence,
        prepared.rows_seen,
        prepared.calibration,
        prepared.recency,
    )[0]
    scoring = alloc.slot_scoring(prepared, budget=20)
    assert np.allclose(survival(scoring, confidence), expected, rtol=1e-9, atol=1e-12)
    assert scoring.budget == 20 and scoring.min_spec_tokens == 4


def test_device_scoring_learns_nothing_and_observed_steps_teach_the_calibration() -> None:
    from policies.slot_scoring import scoring_for

    alloc = allocator()
    rates = rates_of({Task.MATH: 0.8, Task.CHAT: 0.5})
    rows = [row("m", Task.MATH), row("c", Task.CHAT), row("x", Task.MATH)]
    before = [a.copy() for a in alloc.calibration()]
    choice, scoring = alloc.device_scoring(rows, 3, rates, [None, [0.9] * K, None])
    assert choice.reason.endswith("(device)") and scoring.budget > 0
    assert all(np.array_equal(a, b) for a, b in zip(before, alloc.calibration(), strict=True))
    again = alloc.device_scoring(rows, 3, rates, [None, [0.9] * K, None])[1]
    assert again.budget == scoring.budget and np.array_equal(again.base, scoring.base)
    # confident slots (0.97) always accepted, doubtful ones (0.1) never
    confidence = [[0.97] * K, [0.1] * K, [0.97] * K]
    for _ in range(60):
        alloc.observed(scoring, confidence, [6, 6, 6], [7, 1, 7])
    learnt, weight = alloc.calibration()
    bins = alloc._bins(np.array(confidence))[1]
    math, chat = TASK_INDEX[Task.MATH], TASK_INDEX[Task.CHAT]
    assert learnt[math, bins[0, 0]] > 0 and weight[math, bins[0, 0]] > 0.5
    assert learnt[chat, bins[1, 0]] < 0
    # a scoring made ahead serves the same rows, fewer rows, not a new one
    made_for = {"m": 0, "c": 1, "x": 2}
    assert scoring_for(scoring, made_for, ["m", "c", "x"]) is scoring
    fewer = scoring_for(scoring, made_for, ["x", "m"])
    assert fewer is not None and np.array_equal(fewer.base, scoring.base[[2, 0]])
    assert scoring.recency is not None and fewer.recency is not None
    assert np.array_equal(fewer.recency, scoring.recency[[2, 0]])
    assert fewer.budget == round(scoring.budget * 2 / 3)
    assert scoring_for(scoring, made_for, ["m", "new"]) is None


def test_bounds_never_carry_a_step_past_its_budget() -> None:
    """A row the budget gives 1-3 slots is raised to the minimum only within the budget (the
    worst slots past the minimum of other rows give way), as the device allocates; the device
    gets the budget itself, whose token count it fills. Before, raises went past the budget
    and the device's budget was the raised total: on the H200 (session 23, 64 rows) every
    step of goodput's device allocation then ran 416 tokens, a matrix tile dearer than 384."""
    from policies.baselines.slot_budget import allocate_slots, draft_budget, sorted_scores
    from policies.slot_scoring import allocate, bounded_budget

    rng = np.random.default_rng(7)
    rates = rates_of({Task.MATH: 0.9, Task.CHAT: 0.5, Task.CODE: 0.7})
    tasks = (Task.MATH, Task.CHAT, Task.CODE)
    raised = 0
    for trial in range(40):
        alloc = allocator(per_draft=float(rng.uniform(0.005, 0.05)))
        rows = [
            StepRow(f"r{i}", tasks[i % 3], [], [], K, tuple(rng.uniform(0, 1, K)))
            for i in range(12)
        ]
        prepared = alloc.prepare_step(rows, 12, rates)
        confidence = [r.draft_confidence for r in rows]
        survival = alloc.score_step(prepared, confidence)
        scores = sorted_scores(survival, prepared.capacities)
        costs = alloc._costs(12, len(scores))
        unbounded = allocate_slots(survival, prepared.capacities, draft_budget(scores, 12, costs))
        raised += int(((unbounded > 0) & (unbounded < 4)).any())
        # the budget the bounds can spend (slot_scoring.bounded_budget)
        _, budget = bounded_budget(survival, prepared.capacities, 4, 12, costs)
        counts = alloc.finish_step(prepared, confidence).spec_tokens
        assert sum(counts) <= budget, trial
        assert all(k == 0 or k >= 4 for k in counts), trial
        _, scoring = alloc.device_scoring(rows, 12, rates, confidence)
        assert scoring.budget == budget, trial
        device = allocate(scoring, np.array(confidence), scoring.budget)
        assert list(device) == counts, trial  # the host's bounds are the device's
    assert raised >= 5  # the case arose


def test_the_bounded_budget_weighs_what_the_bound_can_spend() -> None:
    """Under k in {0} U [4, K] the budget rule over the unbounded sorted survivals counts slots
    the bound cannot spend (rows of one to three good slots) and so buys too few; weighing the
    bounded allocation's own value (``bounded_budget``) reaches the best step rate over every
    d (each d allocated by ``bounded_allocation``) within 1%, on steps whose costs climb in
    stairs as a GPU's do."""
    from policies.baselines.slot_budget import draft_budget, sorted_scores
    from policies.slot_scoring import bounded_allocation, bounded_budget

    rng = np.random.default_rng(3)
    rows, positions = 16, 15
    caps = np.full(rows, positions)
    costs = 0.01 + 2e-5 * np.ceil((rows + np.arange(rows * positions + 1)) / 32) * 32
    new, old = [], []
    for trial in range(8):
        p = rng.uniform(0.2, 0.95, (rows, positions))
        p[:, 0] = rng.uniform(0.5, 0.95, rows)
        p[rng.uniform(0, 1, rows) < 0.5, 1:] *= 0.6  # rows whose first slot alone is good
        s = np.cumprod(p, axis=1)

        def rate(d: int, s: np.ndarray = s) -> float:
            ks = bounded_allocation(s, caps, d, 4)
            return (rows + float(np.where(np.arange(positions) < ks[:, None], s, 0).sum())) / (
                costs[d]
            )

        best = max(rate(d) for d in range(len(costs)))
        counts, budget = bounded_budget(s, caps, 4, rows, costs)
        assert np.array_equal(counts, bounded_allocation(s, caps, budget, 4)), trial
        new.append(rate(budget) / best)
        old.append(rate(draft_budget(sorted_scores(s, caps), rows, costs)) / best)
    assert np.mean(new) >= 0.99 and np.mean(new) > np.mean(old), (new, old)


def test_the_price_sweep_picks_each_rows_best_allowed_k_at_every_price() -> None:
    """``_priced``: at each price, each row's k of the most expected accepted drafts less the
    price per slot, among k in {0} U [min(low, cap), cap] (equal values: the smaller k),
    against the sweep written out (random survivals, caps, bounds, ties from rounding)."""
    from policies.slot_scoring import PRICES, _priced

    rng = np.random.default_rng(7)
    for trial in range(300):
        rows, positions = int(rng.integers(1, 40)), 15
        s = np.cumprod(rng.uniform(0.3, 1.0, (rows, positions)), axis=1)
        if trial % 3 == 0:
            s = np.round(s, 2)  # equal values: ties broken to the smaller k
        caps = rng.integers(0, positions + 1, rows)
        low = int(rng.integers(1, 6))
        gains, picks = _priced(s, caps, low)
        for p, price in enumerate(PRICES[::9]):
            for row in range(rows):
                least, cap = min(low, int(caps[row])), int(caps[row])
                allowed = [0, *range(max(least, 1), cap + 1)]
                value = [float(np.sum(s[row, :k])) - price * k for k in allowed]
                best = allowed[int(np.argmax(value))]
                got = int(picks[9 * p, row])
                assert (
                    got == best
                    or abs(value[allowed.index(got)] - value[allowed.index(best)]) <= 1e-12
                ), (trial, p, row)
                assert gains[row, got] == pytest.approx(float(np.sum(s[row, :got])))
