"""Per-position acceptance estimates: censoring, priors, decay and request blending."""

from __future__ import annotations

import random

import pytest

from policies.acceptance import (
    PositionCounts,
    blend_request_history,
    expected_accept_length,
    request_window,
    trials_from_step,
)


def test_expected_accept_length_is_one_plus_survival_products() -> None:
    rates = [0.5, 0.5, 0.5]
    assert expected_accept_length(rates, 0) == 1.0
    assert expected_accept_length(rates, 1) == pytest.approx(1.5)
    assert expected_accept_length(rates, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


@pytest.mark.parametrize(
    ("k", "length", "want"),
    [
        (7, 1, (0, True)),
        (7, 4, (3, True)),
        (7, 8, (7, False)),
        (4, 9, (4, False)),
        (0, 1, (0, False)),
    ],
)
def test_trials_from_step(k: int, length: int, want: tuple[int, bool]) -> None:
    assert trials_from_step(k, length) == want


def test_censored_positions_keep_their_prior() -> None:
    counts = PositionCounts([0.5] * 15, prior_strength=10, half_life_steps=1e9)
    for _ in range(200):
        counts.add_step(4, 5)  # all four drafted positions accepted every time
    rates = counts.snapshot().rates
    assert rates[0] > 0.95 and rates[3] > 0.95
    # Positions 5.. were never drafted: no evidence either way, prior unchanged.
    assert rates[4] == pytest.approx(0.5)
    assert counts.snapshot().trials[4] == 0.0


def test_estimates_converge_to_true_conditional_rates() -> None:
    rng = random.Random(0)
    true = [0.9] * 5 + [0.6] * 10
    counts = PositionCounts([0.7] * 15, prior_strength=5, half_life_steps=1e9)
    for _ in range(5000):
        accepted = 0
        while accepted < 15 and rng.random() < true[accepted]:
            accepted += 1
        counts.add_step(15, accepted + 1)
    rates = counts.snapshot().rates
    assert rates[0] == pytest.approx(0.9, abs=0.02)
    assert rates[6] == pytest.approx(0.6, abs=0.05)


def test_a_rejection_only_counts_at_the_rejected_position() -> None:
    counts = PositionCounts([0.5] * 4, prior_strength=1, half_life_steps=1e9)
    counts.add_step(4, 2)  # position 1 accepted, position 2 rejected, 3-4 not at risk
    snap = counts.snapshot()
    assert snap.trials == (1.0, 1.0, 0.0, 0.0)
    assert snap.rates[0] == pytest.approx(0.75)
    assert snap.rates[1] == pytest.approx(0.25)


def test_vllm_position_counts() -> None:
    counts = PositionCounts([0.5] * 3, prior_strength=1e-9, half_life_steps=1e9)
    counts.add_position_counts(num_drafts=100, accepted_per_position=[80, 40, 10])
    rates = counts.snapshot().rates
    assert rates == pytest.approx([0.8, 0.5, 0.25])


def test_decay_forgets_old_evidence() -> None:
    counts = PositionCounts([0.5], prior_strength=1, half_life_steps=10)
    for _ in range(100):
        counts.add_step(1, 2)
    assert counts.snapshot().rates[0] > 0.9
    for _ in range(100):
        counts.add_step(1, 1)
    assert counts.snapshot().rates[0] < 0.1
    # Effective trials stay near the half-life's window, not the 200 steps seen.
    assert counts.snapshot().trials[0] < 20


def test_request_history_blends_towards_its_own_rate() -> None:
    task = [0.8] * 7
    few = blend_request_history(task, [7], [1], strength=6)
    many = blend_request_history(task, [7] * 30, [1] * 30, strength=6)
    assert 0.6 < few[0] < 0.8
    assert many[0] < 0.2
    # Positions past the first rejection were never at risk: they keep the task rate.
    assert many[1] == pytest.approx(0.8)
    # Steps without drafting tell nothing.
    assert blend_request_history(task, [0, 0], [1, 1], strength=6) == pytest.approx(task)


def test_request_half_life_lets_the_latest_steps_lead() -> None:
    task = [0.5] * 7
    # Ten hard steps (nothing accepted), then three easy ones (everything accepted).
    ks = [7] * 13
    lengths = [1] * 10 + [8] * 3
    flat = blend_request_history(task, ks, lengths, strength=2)
    recent = blend_request_history(task, ks, lengths, strength=2, half_life_steps=2)
    assert flat[0] < 0.35  # 3 of 13 (plus the prior) accepted position 1
    assert recent[0] > 0.55  # the last three steps weigh the most
    # Steps with k = 0 age the older steps but add no evidence.
    idle = blend_request_history(task, [7, 0, 0, 0, 0], [8, 1, 1, 1, 1], 2, half_life_steps=2)
    fresh = blend_request_history(task, [7], [8], 2, half_life_steps=2)
    assert task[0] < idle[0] < fresh[0]
    # half_life_steps = 0 keeps every step at full weight (the flat window).
    assert blend_request_history(task, ks, lengths, 2, half_life_steps=0) == pytest.approx(flat)


def test_plain_steps_age_the_evidence_but_observe_nothing() -> None:
    """A step of k = 0 tells nothing about any position, but it is a step of the task: the
    half-life counts it, so a task that stopped drafting does not keep old evidence for
    good (its probes wait for that evidence to fade)."""

    def rejected_100_times(plain_step_age: float) -> PositionCounts:
        counts = PositionCounts([0.5], 1, half_life_steps=10, plain_step_age=plain_step_age)
        for _ in range(100):
            counts.add_step(1, 1)
        return counts

    counts = rejected_100_times(0.5)
    before = counts.snapshot()
    for _ in range(20):
        counts.add_step(0, 1)
    after = counts.snapshot()
    assert after.trials[0] == pytest.approx(before.trials[0] / 2)  # 20 x 0.5: one half-life
    assert after.rates[0] > before.rates[0]  # back towards the prior, 0.5
    many = rejected_100_times(0.5)
    many.add_steps([0] * 20, [1] * 20)  # the rows of plain engine steps, at once
    assert many.snapshot().trials[0] == pytest.approx(after.trials[0])
    assert many.snapshot().rates[0] == pytest.approx(after.rates[0])
    frozen = rejected_100_times(0.0)  # the class's default: plain steps change nothing
    frozen.add_steps([0] * 20, [1] * 20)
    frozen.add_step(0, 1)
    assert frozen.snapshot() == before


def test_add_steps_counts_what_add_step_counts_one_by_one() -> None:
    import random

    from policies.acceptance import PositionCounts

    rng = random.Random(3)
    steps = [(rng.choice([0, 4, 7, 15, 20]), rng.randint(1, 17)) for _ in range(300)]
    one = PositionCounts([0.7] * 15, 4.0, 0.0)
    many = PositionCounts([0.7] * 15, 4.0, 0.0)
    for k, length in steps:
        one.add_step(k, length)
    for start in range(0, len(steps), 64):
        chunk = steps[start : start + 64]
        many.add_steps([k for k, _ in chunk], [n for _, n in chunk])
    assert many.snapshot().rates == pytest.approx(one.snapshot().rates)
    assert many.snapshot().trials == pytest.approx(one.snapshot().trials)


def test_add_steps_counts_the_same_in_python_and_numpy() -> None:
    """Large calls (a 64-row batch's steps between spaced decisions) count with numpy: the
    same state, bit for bit, as the plain-Python loop of small calls."""
    import random

    from policies import acceptance
    from policies.acceptance import PositionCounts

    rng = random.Random(4)
    for size in (acceptance._VECTOR_STEPS, 512):
        ks = [rng.choice([0, 1, 4, 7, 15, 20]) for _ in range(size)]
        lengths = [rng.randint(0, 17) for _ in range(size)]
        vector = PositionCounts([0.6] * 15, 4.0, 50.0)
        vector.add_steps(ks, lengths)
        loop = PositionCounts([0.6] * 15, 4.0, 50.0)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(acceptance, "_VECTOR_STEPS", size + 1)
            loop.add_steps(ks, lengths)
        assert vector.snapshot() == loop.snapshot()
        assert vector._scale == loop._scale
    with pytest.raises(ValueError, match="3 spec_tokens for 2 accept_lengths"):
        PositionCounts([0.6] * 15, 4.0, 50.0).add_steps([1, 2, 3], [1, 2])


def test_a_request_window_counts_drafted_steps_and_every_few_plain_steps_in_a_row() -> None:
    """``request_window``: the last ``size`` entries, each drafted step one and every
    ``plain_per_entry`` consecutive k = 0 steps one (1: the last ``size`` steps)."""
    ks = [7, 0, 0, 0, 7, 0, 0, 7, 0, 0, 0, 0, 0]
    lengths = [3, 1, 1, 1, 5, 1, 1, 2, 1, 1, 1, 1, 1]
    assert request_window(ks, lengths, 4) == (ks[-4:], lengths[-4:])
    # every 2 plain steps in a row one entry: the last run of 5 gives 2 (1 left over), the
    # run of 2 before the last drafted step 1, the run of 3 before that 1 (1 left over)
    assert request_window(ks, lengths, 4, 2) == ([0, 7, 0, 0], [1, 2, 1, 1])
    assert request_window(ks, lengths, 6, 2) == ([0, 7, 0, 7, 0, 0], [1, 5, 1, 2, 1, 1])
    assert request_window(ks, lengths, 99, 2) == (
        [7, 0, 7, 0, 7, 0, 0],
        [3, 1, 5, 1, 2, 1, 1],
    )
    assert request_window([], [], 4, 8) == ([], [])
    assert request_window([0] * 7, [1] * 7, 4, 8) == ([], [])  # not yet a whole entry
