"""`classifier eval --list-errors`: the misclassified real-source requests, with context."""

from collections.abc import Mapping
from typing import Any

import pytest

from controller.classifier.base import TaskGuess
from policies.types import Task
from training.classifier.corpus import Example, user
from training.classifier.evaluation import evaluate, format_errors, report_json, source_noise


class AlwaysChat:
    """A fake classifier: format_errors is the code under test, not the model."""

    def classify(self, body: Mapping[str, Any]) -> TaskGuess:
        return TaskGuess(Task.CHAT, 0.9, {Task.MATH: 0.05, Task.CODE: 0.05, Task.CHAT: 0.9}, 0.0)


def test_errors_list_real_misses_with_label_guess_and_context() -> None:
    follow_up = {
        "messages": [
            {"role": "user", "content": "write a sort"},
            {"role": "assistant", "content": "def sort(x): ..."},
            {"role": "user", "content": "now in Rust"},
        ]
    }
    examples = [
        Example(user("Solve 2x = 4"), Task.MATH, "gsm8k", "g1"),
        Example(user("hello"), Task.CHAT, "mt_bench", "g2"),  # right: not listed
        Example(follow_up, Task.CODE, "sharegpt_later", "g3", answer="fn sort() {}"),
        Example(user("What is 3 * 4?"), Task.MATH, "synthetic_math", "g4"),  # not real
    ]
    text = format_errors(AlwaysChat(), examples, 10)
    assert "2 real-source errors" in text
    assert "gsm8k label=math guess=chat" in text and "synthetic_math" not in text
    assert "'now in Rust'" in text and "context: 'def sort(x): ...\\nwrite a sort'" in text
    assert "answer:  'fn sort() {}'" in text
    assert "hello" not in text
    assert "1 of them" in format_errors(AlwaysChat(), examples, 1)


def test_report_json_has_per_source_counts_accuracy_and_noise() -> None:
    examples = [
        Example(user("Solve 2x = 4"), Task.MATH, "gsm8k", "g1"),
        Example(user("hello"), Task.CHAT, "sharegpt_first", "g2"),
        Example(user("write a sort"), Task.CODE, "sharegpt_first", "g3"),
        Example(user("hi there"), Task.CHAT, "synthetic_switch", "g4"),
    ]
    data = report_json(evaluate(AlwaysChat(), examples))
    assert data["sources"]["sharegpt_first"] == {
        "correct": 1,
        "total": 2,
        "accuracy": 0.5,
        "noise": source_noise(1, 2),
    }
    assert set(data["sources_by_label"]) == {
        "gsm8k (math)",
        "sharegpt_first (chat)",
        "sharegpt_first (code)",
        "synthetic_switch (chat)",
    }
    assert (data["real_examples"], data["real_accuracy"]) == (3, 1 / 3)  # synthetic left out
    assert data["confusion"]["code"] == {"math": 0, "code": 0, "chat": 1}
    assert data["classes"]["chat"]["precision"] == 0.5


def test_noise_is_two_standard_errors_and_never_zero() -> None:
    # Agresti-Coull: p = (c + 2) / (n + 4); 2 * sqrt(p (1 - p) / (n + 4))
    assert source_noise(98, 100) == pytest.approx(2 * (0.9615 * 0.0385 / 104) ** 0.5, rel=1e-3)
    assert source_noise(609, 609) > 0.004  # 100% measured still has a width
    assert source_noise(30, 38) > source_noise(300, 380)
