"""bench/step_mode_mc.py: the Monte Carlo behind the auto step mode's block lengths."""

from __future__ import annotations

from bench.step_mode_mc import share_of_best
from policies.step_mode import ModeSettings


def test_the_chooser_settles_on_the_faster_mode_and_pays_only_while_it_learns() -> None:
    settings = ModeSettings(probe_steps=8, learn_steps=16)
    cut = ModeSettings(probe_steps=8, learn_steps=16, cut_ratio=0.75)
    # Two-phase is half as fast: after learning one-phase runs (with a re-probe block every
    # 512), so a long-lived bucket keeps almost all of the best rate ...
    assert share_of_best(settings, 0.5, 0.05, 2000, seed=0) > 0.98
    assert share_of_best(cut, 0.5, 0.05, 2000, seed=0) > 0.98
    # ... a short one pays for its learning: half of 32 steps at half the rate; with the cut
    # (off by default), 2 two-phase steps after a one-phase block decide it
    assert 0.7 < share_of_best(settings, 0.5, 0.05, 32, seed=0) < 0.8
    assert share_of_best(cut, 0.5, 0.05, 32, seed=0) > 0.95
    # Two-phase faster (a negative gap): the share is of two-phase's rate.
    assert share_of_best(settings, -0.2, 0.05, 2000, seed=1) > 0.98


def test_phases_that_drain_and_slow_leave_a_noiseless_chooser_on_the_faster_mode() -> None:
    """Ten phases, each slowing 10% at 60% and draining from 64 to 33 rows over its last 28%:
    with no noise the paired chooser still settles on one-phase (7% faster) and pays for its
    learning and re-probes only."""
    settings = ModeSettings(probe_steps=8, learn_steps=16)
    share = share_of_best(
        settings, 0.07, 0.0, 1800, seed=0, drift=0.10, shape="step", cycles=10, drain=0.28
    )
    assert 0.99 < share < 1.0
