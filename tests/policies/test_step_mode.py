"""StepModeChooser: per batch-size bucket it measures both step modes, runs the faster one and
re-measures the other now and then; the schedule only moves when a step is decided."""

from __future__ import annotations

import pytest

from policies.step_mode import ModeSettings, StepModeChooser

SETTINGS = ModeSettings(probe_steps=4, learn_steps=8, reprobe_steps=40, margin=0.02, decay=1.0)
# with a tried block that loses by far cut short (off by default): learning one phase first
CUT = ModeSettings(
    probe_steps=4, learn_steps=8, reprobe_steps=40, margin=0.02, decay=1.0, cut_ratio=0.75
)


def run(chooser: StepModeChooser, rows: int, steps: int, rate: dict[bool, float]) -> list[bool]:
    """Decide and record ``steps`` steps of ``rows`` rows; each mode emits ``rate`` tokens/s."""
    modes = []
    for _ in range(steps):
        two = chooser.decide(rows)
        modes.append(two)
        chooser.record(rows, two, int(rate[two] * 0.01), 0.01)
    return modes


def test_it_learns_both_modes_then_runs_the_faster_and_reprobes_the_other() -> None:
    chooser = StepModeChooser(SETTINGS)
    modes = run(chooser, 64, 16, {True: 9000.0, False: 7000.0})
    assert modes == [True] * 4 + [False] * 4 + [True] * 4 + [False] * 4  # blocks of 4
    # with the cut, one phase first (the first two-phase block has one measured before it)
    cut = run(StepModeChooser(CUT), 64, 16, {True: 9000.0, False: 7000.0})
    assert cut == [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4
    later = run(chooser, 64, 72, {True: 9000.0, False: 7000.0})
    # two-phase is faster here; the other mode gets one block of 4 in every 44 decided steps
    # (steps 40-43 of each cycle, counted from the bucket's first step)
    assert later[:24] == [True] * 24
    assert later[24:28] == [False] * 4
    assert later[28:68] == [True] * 40
    assert "two-phase" in chooser.describe(64)


def test_the_faster_mode_wins_per_bucket_and_a_change_of_traffic_is_followed() -> None:
    chooser = StepModeChooser(
        ModeSettings(probe_steps=4, learn_steps=8, reprobe_steps=20, decay=0.9)
    )
    run(chooser, 64, 16, {True: 7000.0, False: 9000.0})
    run(chooser, 8, 16, {True: 9000.0, False: 7000.0})
    assert chooser.peek(64) is False and chooser.peek(50) is False  # same bucket: 33-64 rows
    assert chooser.peek(8) is True and chooser.peek(5) is True
    # the traffic turns: two-phase now pays at 64 rows; the re-probes notice
    modes = run(chooser, 64, 200, {True: 9500.0, False: 7000.0})
    assert modes[-100:].count(True) >= 80  # two-phase now, but for the re-probe blocks
    assert "two-phase" in chooser.describe(64)


def test_peek_does_not_advance_the_schedule_and_hysteresis_keeps_the_incumbent() -> None:
    chooser = StepModeChooser(SETTINGS)
    for _ in range(10):
        assert chooser.peek(64) is True  # learning starts two-phase; peeking moves nothing
    run(chooser, 64, 16, {True: 10000.0, False: 10100.0})  # one-phase 1% faster: learnt
    assert chooser.peek(64) is False
    run(chooser, 64, 44, {True: 10150.0, False: 10000.0})  # two-phase 1.5% ahead now: < margin
    one, two = chooser.rates(64)
    assert one is not None and two is not None and two > one
    assert chooser.peek(64) is False


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="probe_steps"):
        ModeSettings(probe_steps=0)
    with pytest.raises(ValueError, match="decay"):
        ModeSettings(decay=0.0)
    with pytest.raises(ValueError, match="cut_ratio"):
        ModeSettings(cut_ratio=1.0)
    with pytest.raises(ValueError, match="cut_steps"):
        ModeSettings(cut_steps=0)


def test_traffic_that_slows_after_learning_does_not_flip_the_bucket_to_the_slower_mode() -> None:
    """One-phase is 10% faster at every moment, but the traffic slows 30% once both modes are
    learnt (a closed loop's running mix, a draining batch). Rates pooled over each mode's own
    steps would set one-phase's current rate against two-phase's stale one and flip; paired
    blocks (each re-probe against the steps just around it) keep one-phase."""
    settings = ModeSettings(
        probe_steps=4, learn_steps=8, reprobe_steps=40, margin=0.02, decay=0.995, cut_ratio=0.0
    )
    chooser = StepModeChooser(settings)
    run(chooser, 64, 16, {True: 9000.0, False: 10000.0})
    assert chooser.incumbent(64) is False
    modes = run(chooser, 64, 300, {True: 6300.0, False: 7000.0})
    assert chooser.incumbent(64) is False
    assert modes.count(True) <= 7 * 4  # the re-probe blocks only
    ratio = chooser.advantage(64)
    assert ratio is not None and ratio == pytest.approx(0.9, abs=0.01)
    assert "paired blocks 0.900x" in chooser.describe(64)


def test_a_bucket_left_on_the_slower_mode_is_corrected_by_its_next_paired_probe() -> None:
    """Learnt while two-phase was 11% faster, then two-phase becomes 8% slower: the re-probes
    of one-phase, each compared with the two-phase steps just around it, hand the bucket over
    at the second (the first one's two pairs do not yet outweigh the three learnt ones)."""
    chooser = StepModeChooser(SETTINGS)
    run(chooser, 64, 16, {True: 10000.0, False: 9000.0})
    assert chooser.incumbent(64) is True
    run(chooser, 64, 40, {True: 9200.0, False: 10000.0})  # re-probe blocks at 40 and 84
    assert chooser.incumbent(64) is True
    run(chooser, 64, 44, {True: 9200.0, False: 10000.0})
    assert chooser.incumbent(64) is False
    assert chooser.advantage(8) is None  # a bucket never seen has no estimate


def test_pair_decay_is_checked() -> None:
    with pytest.raises(ValueError, match="pair_decay"):
        ModeSettings(pair_decay=1.5)


def test_a_tried_block_that_loses_by_far_is_cut_and_decides_a_learning_bucket() -> None:
    """Two-phase at a third of one-phase's rate (the real pair's draining 64-row bucket,
    session 52) with ``cut_ratio`` on (off by default): learning runs one-phase first, the
    first two-phase block stops after ``cut_steps`` steps and the bucket is one-phase from
    then on, before ``learn_steps``; its re-probes stop as early. Uncut, learning spends two
    full blocks of 4 and a re-probe 4."""
    rates = {True: 3000.0, False: 9000.0}
    chooser = StepModeChooser(CUT)
    modes = run(chooser, 64, 12, rates)
    assert modes == [False] * 4 + [True] * 2 + [False] * 6
    assert chooser.incumbent(64) is False
    assert chooser.advantage(64) == pytest.approx(1 / 3)
    later = run(chooser, 64, 88, rates)  # re-probes at decided steps 40 and 84 of a cycle of 44
    assert later.count(True) == 2 * 2
    uncut = run(StepModeChooser(SETTINGS), 64, 100, rates)
    assert uncut.count(True) == 4 + 4 + 4 + 4  # learning 2 blocks, then 2 re-probes


def test_a_cut_needs_every_one_of_its_last_steps_slow_and_the_other_way_round_too() -> None:
    """One stall (a step 5x its price) does not cut a block: the next step is at full speed.
    And a one-phase block losing by far to two-phase is cut as well (learning is symmetric)."""
    chooser = StepModeChooser(CUT)
    run(chooser, 64, 4, {True: 9000.0, False: 9000.0})  # the one-phase block
    assert chooser.decide(64) is True
    chooser.record(64, True, 90, 0.05)  # a stall: 1,800 tok/s
    assert chooser.decide(64) is True
    chooser.record(64, True, 90, 0.01)
    assert chooser.decide(64) is True  # not cut: the block runs on
    faster = StepModeChooser(CUT)
    modes = run(faster, 64, 10, {True: 9000.0, False: 2000.0})
    # the first block is one-phase with nothing before it to lose to: it runs its length;
    # two-phase's block then decides nothing (it wins), one-phase's second block is cut at 2
    assert modes[:4] == [False] * 4 and modes[4:8] == [True] * 4 and modes[8:10] == [False] * 2
    assert faster.incumbent(64) is True
    assert run(faster, 64, 20, {True: 9000.0, False: 2000.0}) == [True] * 20


def test_the_goodput_policy_s_mode_settings_are_the_chooser_s() -> None:
    """``ModeSettings.of``: every ``mode_*`` setting of the policy file reaches the chooser
    (the engine's and the simulator's both build theirs with it)."""
    from policies.model import GoodputSpec

    spec = GoodputSpec(
        mode_probe_steps=3,
        mode_learn_steps=5,
        mode_reprobe_steps=70,
        mode_margin=0.04,
        mode_cut_ratio=0.6,
    )
    assert ModeSettings.of(spec) == ModeSettings(
        probe_steps=3, learn_steps=5, reprobe_steps=70, margin=0.04, cut_ratio=0.6
    )
    assert ModeSettings.of(GoodputSpec()) == ModeSettings()
