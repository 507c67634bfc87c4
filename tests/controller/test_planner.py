"""Planner: hint > classifier > fallback; failures degrade safely and are counted."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from controller.classifier.base import TaskGuess, uniform_scores
from controller.config import ClassifierConfig
from controller.metrics import Metrics
from controller.planner import Planner
from controller.policy.running import RunningPolicy
from controller.request_parse import parse_request
from controller.stats import LiveStats, ScrapedView
from engines.config import PoolConfig
from engines.pool import PoolBackend
from policies.model import PolicySpec
from policies.types import Task

RAW = b'{"model": "m", "messages": [{"role": "user", "content": "integrate x^2"}]}'


class FakeClassifier:
    def __init__(self, task: Task, confidence: float, fails: bool = False) -> None:
        self.guess = TaskGuess(task, confidence, uniform_scores(), 1e-4)
        self.fails = fails

    def classify(self, body: Mapping[str, Any]) -> TaskGuess:
        if self.fails:
            raise RuntimeError("broken model")
        return self.guess


def _planner(classifier: FakeClassifier | None) -> tuple[Planner, Metrics]:
    metrics = Metrics()
    config = ClassifierConfig(min_confidence=0.6, fallback_task=Task.CHAT)
    return Planner(config, classifier, LiveStats(60, time.monotonic()), metrics), metrics


def _fleet() -> list[PoolBackend]:
    return [
        PoolBackend(
            PoolConfig(name=f"k{k}", kind="vllm", urls=["http://h"], model="m", spec_tokens=k)
        )
        for k in (0, 7, 15)
    ]


@pytest.mark.parametrize(
    ("classifier", "header", "want"),
    [
        (FakeClassifier(Task.MATH, 0.9), None, (Task.MATH, "classifier", "k15")),
        (FakeClassifier(Task.MATH, 0.4), None, (Task.CHAT, "fallback", "k7")),
        (FakeClassifier(Task.MATH, 0.9), "code", (Task.CODE, "hint", "k15")),
        (None, None, (Task.CHAT, "fallback", "k7")),
    ],
)
def test_task_source_and_pool(
    classifier: FakeClassifier | None, header: str | None, want: tuple[Task, str, str]
) -> None:
    planner, _ = _planner(classifier)
    parsed = parse_request("chat", RAW, header, allow_hint=True)
    plan = planner.plan(parsed, _fleet(), RunningPolicy.build(1, PolicySpec()))
    assert (plan.task, plan.task_source, plan.pools[0].name) == want
    assert [p.name for p in plan.pools][1:] != []  # the rest is the retry plan


def test_hint_ignored_when_not_allowed() -> None:
    planner, _ = _planner(FakeClassifier(Task.MATH, 0.9))
    parsed = parse_request("chat", RAW, "code", allow_hint=False)
    assert planner.classify(parsed) == (Task.MATH, 0.9, "classifier")


def test_failing_classifier_falls_back_and_counts() -> None:
    planner, metrics = _planner(FakeClassifier(Task.MATH, 0.9, fails=True))
    parsed = parse_request("chat", RAW, None, allow_hint=True)
    assert planner.classify(parsed) == (Task.CHAT, 0.0, "fallback")
    assert b'draftctl_degraded_decisions_total{component="classifier"} 1.0' in metrics.render()


def test_scraped_load_counts_toward_concurrency() -> None:
    planner, _ = _planner(None)
    fleet = _fleet()
    parsed = parse_request("chat", RAW, None, allow_hint=True)
    running = RunningPolicy.build(1, PolicySpec())
    assert planner.plan(parsed, fleet, running).decision.spec_tokens == 7  # chat, load 1
    # Other clients keep 50 running + 20 waiting on the k7 pool: fleet load 71 -> chat off.
    planner.stats.scraped["k7"] = ScrapedView(running=50, waiting=20)
    plan = planner.plan(parsed, fleet, running)
    assert plan.concurrency == 71 and plan.decision.spec_tokens == 0
    assert plan.pools[0].name == "k0"


def test_uncertain_scores_mix_the_task_priors() -> None:
    """Not a hard fallback: the observation's acceptance is the score-weighted mixture."""
    from policies.task_mixture import mixed_rates

    planner, _ = _planner(None)
    running = RunningPolicy.build(1, PolicySpec(kind="goodput"))
    fields = {task: running.observe(task) for task in (Task.MATH, Task.CHAT)}
    assert all(fields.values()), "goodput has online models with per-task priors"
    rates = {task: tuple(f["accept_rates"]) for task, f in fields.items() if f is not None}
    assert rates[Task.MATH] != rates[Task.CHAT]
    scores = {Task.MATH: 0.5, Task.CODE: 0.0, Task.CHAT: 0.5}
    _, observation = planner.decide(Task.CHAT, 0.5, _fleet(), running, scores)
    assert observation is not None
    assert observation.accept_rates == pytest.approx(mixed_rates(rates, scores))
    sure = {Task.MATH: 0.995, Task.CODE: 0.0, Task.CHAT: 0.005}
    _, observation = planner.decide(Task.MATH, 0.995, _fleet(), running, sure)
    assert observation is not None
    assert observation.accept_rates == pytest.approx(rates[Task.MATH])
