"""Windowed increases of engine counters: resets, missing series, pruning, pool totals."""

from __future__ import annotations

import pytest

from engines.prometheus_text import ScrapeSample
from engines.stats_window import CounterWindow, combine


def _sample(
    t: float, drafts: float | None, accepted: float | None, per_pos: tuple[float, ...] = ()
) -> ScrapeSample:
    return ScrapeSample(
        time_s=t,
        running=t,  # a recognisable gauge value
        waiting=0.0,
        num_drafts=drafts,
        num_draft_tokens=None if drafts is None else drafts * 3,
        num_accepted_tokens=accepted,
        accepted_per_position=per_pos,
    )


def test_increase_over_the_window_and_derived_rates() -> None:
    window = CounterWindow(window_s=60.0)
    window.add(_sample(0.0, 100.0, 50.0, (40.0, 10.0, 0.0)))
    window.add(_sample(10.0, 110.0, 62.0, (48.0, 14.0, 0.0)))
    window.add(_sample(20.0, 120.0, 70.0, (55.0, 15.0, 0.0)))
    stats = window.stats()
    assert stats is not None
    assert stats.span_s == 20.0
    assert (stats.num_drafts, stats.num_accepted_tokens, stats.num_draft_tokens) == (
        20.0,
        20.0,
        60.0,
    )
    assert stats.accepted_per_position == (15.0, 5.0, 0.0)
    assert stats.mean_accept_length == pytest.approx(2.0)
    assert stats.accept_rate_per_position == pytest.approx([0.75, 0.25, 0.0])
    assert stats.draft_acceptance_rate == pytest.approx(20 / 60)
    assert stats.running == 20.0  # the latest gauge, not a sum


def test_counter_reset_counts_the_new_value_as_the_increase() -> None:
    window = CounterWindow(window_s=60.0)
    window.add(_sample(0.0, 500.0, 300.0, (200.0, 100.0)))
    window.add(_sample(5.0, 510.0, 306.0, (204.0, 102.0)))
    window.add(_sample(10.0, 4.0, 2.0, (2.0, 0.0)))  # server restarted
    stats = window.stats()
    assert stats is not None
    assert stats.num_drafts == 14.0
    assert stats.num_accepted_tokens == 8.0
    assert stats.accepted_per_position == (6.0, 2.0)


def test_samples_older_than_the_window_stop_counting() -> None:
    window = CounterWindow(window_s=10.0)
    for t, drafts in [(0.0, 0.0), (5.0, 100.0), (12.0, 110.0), (20.0, 115.0)]:
        window.add(_sample(t, drafts, 0.0))
    stats = window.stats()
    assert stats is not None
    # Baseline is the newest sample at or before 20 - 10 = 10 (t=5): 115 - 100.
    assert stats.num_drafts == 15.0
    assert stats.span_s == 15.0


def test_pairs_with_a_missing_series_contribute_nothing() -> None:
    window = CounterWindow(window_s=60.0)
    window.add(_sample(0.0, 10.0, 5.0, (5.0,)))
    window.add(_sample(1.0, None, None))  # e.g. a restart without speculation
    window.add(_sample(2.0, 3.0, 1.0, (1.0,)))
    window.add(_sample(3.0, 7.0, 2.0, (2.0,)))
    stats = window.stats()
    assert stats is not None
    assert stats.num_drafts == 4.0
    assert stats.accepted_per_position == (1.0,)


def test_never_reported_series_stay_none_and_rates_unknown() -> None:
    window = CounterWindow(window_s=60.0)
    assert window.stats() is None
    window.add(_sample(0.0, None, None))
    window.add(_sample(1.0, None, None))
    stats = window.stats()
    assert stats is not None
    assert stats.num_drafts is None
    assert stats.mean_accept_length is None
    assert stats.accept_rate_per_position == []
    assert stats.draft_acceptance_rate is None


def test_single_sample_has_zero_increase() -> None:
    window = CounterWindow(window_s=60.0)
    window.add(_sample(0.0, 100.0, 50.0))
    stats = window.stats()
    assert stats is not None and stats.num_drafts == 0.0 and stats.mean_accept_length is None


def test_out_of_order_samples_and_bad_window_are_rejected() -> None:
    window = CounterWindow(window_s=60.0)
    window.add(_sample(5.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="older than the last one"):
        window.add(_sample(4.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="window_s must be positive"):
        CounterWindow(window_s=0)


def test_combine_adds_up_a_pools_servers() -> None:
    a, b = CounterWindow(60.0), CounterWindow(60.0)
    a.add(_sample(0.0, 0.0, 0.0, (0.0, 0.0)))
    a.add(_sample(1.0, 10.0, 8.0, (6.0, 2.0)))
    b.add(_sample(0.0, 0.0, 0.0))
    b.add(_sample(2.0, 10.0, 2.0))
    stats_a, stats_b = a.stats(), b.stats()
    assert stats_a is not None and stats_b is not None
    pool = combine([stats_a, stats_b])
    assert pool is not None
    assert pool.num_drafts == 20.0
    assert pool.mean_accept_length == pytest.approx(1.5)
    assert pool.accepted_per_position == (6.0, 2.0)
    assert pool.running == 3.0  # 1 + 2 running requests
    assert combine([]) is None
