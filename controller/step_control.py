"""Per-step k for the embedded engine: the running policy, asked before every verify step.

The engine calls the controller on its own thread, so everything it reads is captured when
the request starts (the policy object, windowed acceptance estimates) or comes with the
step (the request's own history, the batch size). A failing policy gives k = 0 and counts.

The goodput policy is batch-aware here: the engine verifies every row of a step at the widest
row's width and drafts for every row once any row drafts, so one k per step is chosen for the
whole batch (``policies.batch_width.BatchWidth``, one per engine thread) and every row gets
it; the decision is made on the step's first call and the other rows' calls are lookups.
Other policies are asked per request.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.metrics import Metrics
from controller.policy_state import RunningPolicy
from controller.stats import LiveStats
from engines.embedded.events import RequestView
from policies.batch_width import BatchWidth
from policies.online import OnlineModels
from policies.types import Observation, StepCost, Task

log = logging.getLogger(__name__)


@dataclass
class RequestSteps:
    """The state one request's controller keeps between steps."""

    task: Task
    confidence: float
    first_spec_tokens: int
    block_size: int
    running: RunningPolicy
    accept_rates: tuple[float, ...]
    accept_trials: tuple[float, ...]
    step_cost: StepCost | None  # a snapshot: immutable, safe on the engine thread
    metrics: Metrics
    spec_tokens: list[int] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)

    def __call__(self, view: RequestView) -> int:
        if self.running.models is not None:
            k = self._shared(view)
        elif view.step_index == 0:
            k = self.first_spec_tokens  # the gateway's decision, as told to the client
        else:
            k = self._decide(view)
        self.spec_tokens.append(k)
        return k

    def _shared(self, view: RequestView) -> int:
        """The step's shared k from this engine thread's planner (goodput policy)."""
        try:
            width, models = _engine_planner(self.running, self.block_size)
            return width.spec_tokens(
                view.request_id, self.task, view.batch_size, view.accept_lengths, models.observe
            )
        except Exception:
            log.exception("batch planner failed on a step; drafting off for this step")
            self.metrics.degraded.labels("policy").inc()
            return 0

    def _decide(self, view: RequestView) -> int:
        lo, hi = self.running.spec.bounds_for(self.block_size)
        history = tuple(view.accept_lengths)
        observation = Observation(
            task=self.task,
            confidence=self.confidence,
            concurrency=view.batch_size,
            min_spec_tokens=lo,
            max_spec_tokens=hi,
            block_size=self.block_size,
            accept_rates=self.accept_rates,
            accept_trials=self.accept_trials,
            step_cost=self.step_cost,
            request_accept_lengths=history,
            request_spec_tokens=tuple(self.spec_tokens[: len(history)]),
            previous_spec_tokens=self.spec_tokens[-1] if self.spec_tokens else None,
            step_index=view.step_index,
            now_s=time.monotonic(),
            rng_u=self.rng.random(),
        )
        try:
            return self.running.policy.decide(observation).spec_tokens
        except Exception:
            log.exception("policy failed on a step; drafting off for this step")
            self.metrics.degraded.labels("policy").inc()
            return 0


_threads = threading.local()


def _engine_planner(running: RunningPolicy, block_size: int) -> tuple[BatchWidth, OnlineModels]:
    """The planner of the calling engine thread, rebuilt when a newer policy version arrives
    (rows of older versions then join it) or the block size changes."""
    assert running.models is not None
    held = getattr(_threads, "planner", None)
    if held is None or held[0] < running.version or held[1] != block_size:
        lo, hi = running.spec.bounds_for(block_size)
        width = BatchWidth(running.models.spec, block_size, lo, hi, random.Random().random)
        held = _threads.planner = (running.version, block_size, width, running.models)
    return held[2], held[3]


StepControllerFactory = Callable[[Task, float, int, int], RequestSteps]


class StepDecider:
    """Makes one RequestSteps per embedded request (called on the event loop)."""

    def __init__(
        self, policy: Callable[[], RunningPolicy], stats: LiveStats, metrics: Metrics
    ) -> None:
        self.policy = policy
        self.stats = stats
        self.metrics = metrics

    def __call__(
        self, task: Task, confidence: float, first_spec_tokens: int, block_size: int
    ) -> RequestSteps:
        running = self.policy()
        estimates = self.stats.estimates(task, time.monotonic())
        learned = running.observe(task) or {
            "accept_rates": estimates.accept_rates,
            "accept_trials": estimates.accept_trials,
            "step_cost": None,
        }
        return RequestSteps(
            task,
            confidence,
            first_spec_tokens,
            block_size,
            running,
            learned["accept_rates"],
            learned["accept_trials"],
            learned["step_cost"],
            self.metrics,
        )
