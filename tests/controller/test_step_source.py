"""The daemon's policy source for the embedded engine's step controller."""

from __future__ import annotations

from controller.metrics import Metrics
from controller.policy.running import RunningPolicy
from controller.stats import LiveStats
from controller.step_source import DaemonStepSource
from policies.model import PolicySpec
from policies.types import Task


def test_source_serves_the_running_policy_windowed_acceptance_and_counts_failures() -> None:
    running = RunningPolicy.build(3, PolicySpec())
    metrics = Metrics()
    source = DaemonStepSource(lambda: running, LiveStats(60, 0.0), metrics, clock=lambda: 1.0)
    assert source.active() is running
    learned = source.acceptance(Task.MATH)
    assert set(learned) == {"accept_rates", "accept_trials"}
    source.policy_failed()
    assert b'draftctl_degraded_decisions_total{component="policy"} 1.0' in metrics.render()
