"""What the daemon gives the embedded engine's step controller (engines/step_controller.py):
the running policy, windowed acceptance estimates for policies without online models, and a
counter for decisions that failed. Called on the event loop when a request starts, except
``policy_failed`` (engine thread; a prometheus counter is thread-safe)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from controller.metrics import Metrics
from controller.policy.running import RunningPolicy
from controller.stats import LiveStats
from policies.types import Task


class DaemonStepSource:
    """Implements ``engines.step_controller.StepPolicySource`` for the daemon."""

    def __init__(
        self,
        policy: Callable[[], RunningPolicy],
        stats: LiveStats,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._stats = stats
        self._metrics = metrics
        self._clock = clock

    def active(self) -> RunningPolicy:
        return self._policy()

    def acceptance(self, task: Task) -> Mapping[str, Any]:
        estimates = self._stats.estimates(task, self._clock())
        return {"accept_rates": estimates.accept_rates, "accept_trials": estimates.accept_trials}

    def policy_failed(self) -> None:
        self._metrics.degraded.labels("policy").inc()
