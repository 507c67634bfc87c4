"""ShareGPT decoding and the labelling rules documented in docs/classifier.md."""

import json
from pathlib import Path

import pytest

from controller.classifier.sharegpt import iter_records, iter_turns, label_turn
from policies.types import Task

CODE_ANSWER = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"


@pytest.mark.parametrize(
    ("prompt", "answer", "expected"),
    [
        ("write a python add function", CODE_ANSWER, Task.CODE),
        ("Write a haiku about autumn", "Leaves fall, quiet light.", Task.CHAT),
        # Code syntax in the prompt but a prose answer: ambiguous, dropped.
        ("what does `def f(): pass` mean", "It defines a function.", None),
        # A maths cue but a prose answer: ShareGPT gives no maths labels.
        ("How many days are in 3 weeks?", "There are 21 days.", None),
        ("Explain", "See ```x``` and a long prose answer " + "word " * 200, None),
        ("", CODE_ANSWER, None),
    ],
)
def test_label_rules(prompt: str, answer: str, expected: Task | None) -> None:
    assert label_turn(prompt, answer) == expected


def test_truncated_array_yields_the_complete_records(tmp_path: Path) -> None:
    records = [
        {"id": "abc_0", "conversations": [{"from": "human", "value": "hi"}]},
        {"id": "abc_1", "conversations": []},
    ]
    text = json.dumps(records, indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) - 20])  # cut inside the second record
    assert [r["id"] for r in iter_records(path)] == ["abc_0"]


def test_turns_carry_history_and_the_answer_that_follows() -> None:
    record = {
        "id": "conv_3",
        "conversations": [
            {"from": "gpt", "value": "(continued)"},
            {"from": "human", "value": "q1"},
            {"from": "gpt", "value": "a1"},
            {"from": "human", "value": "q2"},
            {"from": "gpt", "value": "a2"},
            {"from": "human", "value": "unanswered"},
        ],
    }
    turns = list(iter_turns(record))
    assert [t.answer for t in turns] == ["a1", "a2"]
    assert turns[1].conversation_id == "conv"
    assert [m["content"] for m in turns[1].messages] == ["(continued)", "q1", "a1", "q2"]
