"""Per request: which task, which k, and which pools to try, in order.

Classifier and policy failures never fail the request: the classifier falls back to the
configured task, the policy to k = 0 (drafting off, always safe), and each is counted.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from controller.classifier.base import Classifier, apply_threshold
from controller.config import ClassifierConfig
from controller.deferred import after_first_byte
from controller.metrics import Metrics
from controller.observe import build_observation, pool_view
from controller.policy.running import RunningPolicy
from controller.request_parse import ParsedRequest
from controller.stats import LiveStats
from engines.base import Backend
from policies.routing import rank_pools
from policies.types import Decision, Observation, PoolView, Task

log = logging.getLogger(__name__)


@dataclass  # not frozen: one is built per request, and frozen fields cost a setattr call each
class Plan:
    task: Task
    confidence: float
    task_source: str  # "hint" | "classifier" | "fallback"
    decision: Decision
    pools: list[Backend]  # healthy, best first; the tail is the retry plan
    running: RunningPolicy  # the policy that decided (learns from the outcome)
    concurrency: int  # the load the decision saw
    views: list[PoolView]  # what the policy saw of ``pools``, same order
    task_scores: Mapping[Task, float] | None = None  # the classifier's probabilities, if it ran


class Planner:
    def __init__(
        self,
        config: ClassifierConfig,
        classifier: Classifier | None,
        stats: LiveStats,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.classifier = classifier
        self.stats = stats
        self.metrics = metrics
        self.clock = clock
        self._rng = random.Random()

    def classify(self, parsed: ParsedRequest) -> tuple[Task, float, str]:
        task, confidence, source, _ = self.guess(parsed)
        return task, confidence, source

    def guess(self, parsed: ParsedRequest) -> tuple[Task, float, str, Mapping[Task, float] | None]:
        """Task, confidence, where the task came from, and the classifier's probability per
        task (None for a client hint or without a classifier: no mixing of priors)."""
        if parsed.task_hint is not None:
            return parsed.task_hint, 1.0, "hint", None
        if self.classifier is None:
            return self.config.fallback_task, 0.0, "fallback", None
        try:
            guess = self.classifier.classify(parsed.body)
        except Exception:
            log.exception("classifier failed; using the fallback task")
            self.metrics.degraded.labels("classifier").inc()
            return self.config.fallback_task, 0.0, "fallback", None
        after_first_byte(self._record_classify, guess.latency_s)
        final = apply_threshold(guess, self.config.min_confidence, self.config.fallback_task)
        source = "fallback" if final.is_fallback else "classifier"
        # No text at all (confidence 0, uniform scores) says nothing: the fallback's priors.
        scores = guess.scores if guess.confidence > 0.0 else None
        return final.task, final.confidence, source, scores

    def _record_classify(self, latency_s: float) -> None:
        self.metrics.classify_seconds.observe(latency_s)
        self.stats.record_classify(self.clock(), latency_s)

    def decide(
        self,
        task: Task,
        confidence: float,
        fleet: Sequence[Backend],
        running: RunningPolicy,
        scores: Mapping[Task, float] | None = None,
    ) -> tuple[Decision, Observation | None]:
        """The decision and the observation it saw (None if building it failed). With
        ``scores``, the acceptance priors are their mixture (``policies.task_mixture``)."""
        observation = None
        try:
            observation = build_observation(
                task, confidence, fleet, running, self.stats, self.clock(), self._rng.random(),
                scores,
            )  # fmt: skip
            return running.policy.decide(observation), observation
        except Exception as exc:
            log.exception("policy %s failed; drafting off for this request", running.spec.kind)
            self.metrics.degraded.labels("policy").inc()
            reason = f"policy failed ({type(exc).__name__}); safe fallback k=0"
            return Decision(0, reason), observation

    def plan(self, parsed: ParsedRequest, fleet: Sequence[Backend], running: RunningPolicy) -> Plan:
        task, confidence, source, scores = self.guess(parsed)
        decision, observation = self.decide(task, confidence, fleet, running, scores)
        if observation is None:
            views: Sequence[PoolView] = [pool_view(b) for b in fleet]
            concurrency = 0
        else:
            views, concurrency = observation.pools, observation.concurrency
        by_name = {b.name: b for b in fleet}
        ranked = rank_pools(views, decision, running.spec.spill_margin)
        pools = [by_name[v.name] for v in ranked]
        return Plan(task, confidence, source, decision, pools, running, concurrency, ranked, scores)
