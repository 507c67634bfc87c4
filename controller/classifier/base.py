"""The classifier seam: what the gateway asks and what it gets back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from policies.types import TASKS, Task


@dataclass(frozen=True)
class TaskGuess:
    """The task of one request, how sure the classifier is, and what it cost.

    ``confidence`` is the winning class's probability (0.0 when the request carried no
    text); ``scores`` holds every task's probability; ``latency_s`` is the wall time of the
    ``classify`` call, text extraction included. ``is_fallback`` marks a guess that
    :func:`apply_threshold` replaced because the classifier was not sure enough.
    """

    task: Task
    confidence: float
    scores: dict[Task, float]
    latency_s: float
    is_fallback: bool = False


class Classifier(Protocol):
    """Maps an OpenAI request body (chat ``messages`` or completions ``prompt``) to a task."""

    def classify(self, body: Mapping[str, Any]) -> TaskGuess: ...


def uniform_scores() -> dict[Task, float]:
    return {task: 1.0 / len(TASKS) for task in TASKS}


def apply_threshold(guess: TaskGuess, min_confidence: float, fallback_task: Task) -> TaskGuess:
    """Replace a guess below ``min_confidence`` with ``fallback_task``.

    The fallback keeps the original confidence and scores so that callers can still log what
    the model thought; ``is_fallback`` tells them it was overridden.
    """
    if guess.confidence >= min_confidence:
        return guess
    return TaskGuess(
        task=fallback_task,
        confidence=guess.confidence,
        scores=guess.scores,
        latency_s=guess.latency_s,
        is_fallback=True,
    )
