"""`classifier eval --list-errors`: the misclassified real-source requests, with context."""

from collections.abc import Mapping
from typing import Any

from controller.classifier.base import TaskGuess
from policies.types import Task
from training.classifier.corpus import Example, user
from training.classifier.evaluation import format_errors


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
