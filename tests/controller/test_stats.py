"""Stats windows: samples age out, sums stay exact, acceptance is pooled correctly."""

from __future__ import annotations

from controller.speedup import speedup_for_task
from controller.stats import LiveStats, spec_counts
from controller.windows import CountWindow, Window, quantile
from engines.base import Outcome
from policies.types import Task


def test_window_drops_samples_older_than_window() -> None:
    window = Window(window_s=10)
    window.record(0.0, 1.0)
    window.record(5.0, 3.0)
    assert window.mean(9.0) == 2.0
    assert window.values(12.0) == [3.0]  # the t=0 sample is older than 10 s at t=12
    assert window.mean(20.0) is None


def test_count_window_running_sum_matches_recount() -> None:
    window = CountWindow(window_s=10)
    window.record(0.0, [4, 6, 3])
    window.record(6.0, [2, 1])
    assert window.total(7.0) == [6, 7, 3]
    assert window.total(11.0) == [2, 1, 0]  # first sample gone, its position column zeroed
    assert window.total(30.0) == []


def test_quantile_nearest_rank() -> None:
    assert quantile([], 0.5) is None
    assert quantile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert quantile([float(i) for i in range(101)], 0.99) == 99.0


def test_spec_counts_from_vllm_and_embedded_outcomes() -> None:
    vllm = Outcome(num_drafts=4, num_accepted_tokens=10, accepted_per_position=[4, 3, 2, 1])
    assert spec_counts(vllm) == [4, 10, 4, 3, 2, 1]
    assert spec_counts(Outcome(accept_lengths=[3, 1, 5])) == [3, 6]
    assert spec_counts(Outcome()) is None


def test_accept_length_and_conditional_rates_pool_over_backends() -> None:
    stats = LiveStats(window_s=60, started_s=0.0)
    # k=2 pool: 10 steps, position 1 accepted 8 times, position 2 accepted 4 times.
    stats.record_outcome(
        1.0,
        Task.MATH,
        "k2",
        Outcome(num_drafts=10, num_accepted_tokens=12, accepted_per_position=[8, 4]),
        None,
    )
    # k=3 pool: 10 steps, 6 / 3 / 1 accepted at positions 1..3.
    stats.record_outcome(
        1.0,
        Task.MATH,
        "k3",
        Outcome(num_drafts=10, num_accepted_tokens=10, accepted_per_position=[6, 3, 1]),
        None,
    )
    assert stats.task_accept_length(Task.MATH, 2.0) == 1 + 22 / 20
    rates, trials = stats.accept_rates(Task.MATH, 2.0)
    # Position 3 was only drafted by the k3 pool: 1 of its 3 reaching position 3.
    assert rates == (14 / 20, 7 / 14, 1 / 3)
    assert trials == (20.0, 14.0, 3.0)
    assert stats.task_accept_length(Task.CHAT, 2.0) is None
    assert stats.task_accept_length(Task.MATH, 100.0) is None  # aged out


def test_speedup_from_tpot_needs_both_pools() -> None:
    k = {"k0": 0, "k7": 7}
    assert speedup_for_task({"k7": [0.01]}, k)["value"] is None
    result = speedup_for_task({"k0": [0.03, 0.03], "k7": [0.01, 0.02, 0.01]}, k)
    assert result["value"] == 3.0 and result["method"] == "tpot-vs-no-spec-pool"
    assert result["is_estimate"] is False


def test_speedup_without_a_no_spec_pool_is_a_labelled_cost_model_estimate() -> None:
    k = {"k7": 7}
    assert speedup_for_task({"k7": [0.01]}, k)["value"] is None  # no acceptance reported
    result = speedup_for_task({"k7": [0.01, 0.01]}, k, accept_length=3.0, concurrency=1)
    assert result["method"] == "cost-model-estimate" and result["is_estimate"] is True
    # RelativeCost at batch 1, width 8: plain 1.0, speculative 1.15 + 0.0045 * 7.
    assert result["value"] == round(3.0 / (1.15 + 0.0045 * 7), 3)
    busy = speedup_for_task({"k7": [0.01]}, k, accept_length=3.0, concurrency=64)
    assert busy["value"] < result["value"]  # verification costs more under load
    # A measured k=0 pool wins over the estimate.
    measured = speedup_for_task({"k0": [0.03], "k7": [0.01]}, {"k0": 0, "k7": 7}, 3.0)
    assert measured["method"] == "tpot-vs-no-spec-pool"


def test_step_time_speedup_for_the_embedded_engine() -> None:
    stats = LiveStats(window_s=60, started_s=0.0)
    outcome = Outcome(
        accept_lengths=[3, 3], step_times_s=[0.02, 0.02], plain_step_times_s=[0.01, 0.01]
    )
    stats.record_outcome(1.0, Task.CODE, "emb", outcome, None)
    view = stats.snapshot(2.0, 2.0, [], {"version": 1, "kind": "static"})
    speedup = view["tasks"]["code"]["speedup"]
    assert speedup["method"] == "step-times" and speedup["value"] == 1.5  # 3 x 10 ms / 20 ms
    assert view["tasks"]["chat"]["speedup"]["value"] is None


def test_every_task_on_the_engine_shares_the_plain_step_baseline() -> None:
    """Code ran only drafting steps; the k = 0 steps of chat on the same engine are its
    baseline (a plain step costs the same for any task). Another engine's are not."""
    stats = LiveStats(window_s=60, started_s=0.0)
    code = Outcome(accept_lengths=[4, 4], step_times_s=[0.02, 0.02])
    chat = Outcome(accept_lengths=[2], step_times_s=[0.02], plain_step_times_s=[0.01, 0.01])
    other = Outcome(plain_step_times_s=[1.0, 1.0, 1.0])
    stats.record_outcome(1.0, Task.CODE, "emb", code, None)
    stats.record_outcome(1.0, Task.CHAT, "emb", chat, None)
    stats.record_outcome(1.0, Task.MATH, "other", other, None)
    view = stats.snapshot(2.0, 2.0, [], {"version": 1, "kind": "static"})
    code_speedup = view["tasks"]["code"]["speedup"]
    assert code_speedup["method"] == "step-times" and code_speedup["value"] == 2.0  # 4 x 10 / 20
    assert view["tasks"]["chat"]["speedup"]["value"] == 1.0  # 2 x 10 / 20
    assert view["tasks"]["math"]["speedup"]["value"] is None  # no drafting steps at all
