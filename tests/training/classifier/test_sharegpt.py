"""ShareGPT decoding and the labelling rules documented in docs/classifier.md."""

import json
from pathlib import Path

import pytest

from policies.types import Task
from training.classifier.sharegpt import iter_records, iter_turns, label_turn

CODE_ANSWER = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"


EUCLID = "20672 = 2 x 8512 + 3648\n8512 = 2 x 3648 + 1216\n3648 = 3 x 1216 + 0\nSo the gcd is 1216."
CONTINUED_CODE = (
    '))\nbudget = int(input("Enter your budget: "))\nif option == "3":\n'
    "    with open('profiles.json') as f:\n        data = json.load(f)\n"
)
PING = "64 bytes from host: icmp_seq=1 ttl=64 time=0.4 ms\n" * 3


@pytest.mark.parametrize(
    ("prompt", "answer", "expected"),
    [
        ("write a python add function", CODE_ANSWER, Task.CODE),
        ("Write a haiku about autumn", "Leaves fall, quiet light.", Task.CHAT),
        # Code syntax in the prompt but a prose answer: ambiguous, dropped.
        ("what does `def f(): pass` mean", "It defines a function.", None),
        # The answer decides, not a maths cue in the prompt: a prose answer is chat...
        ("How many days are in 3 weeks?", "There are 21 days.", Task.CHAT),
        # ...worked equations are maths...
        ("Find gcd(8512, 20672) with Euclid's algorithm", EUCLID, Task.MATH),
        # ...and prose with a single formula is neither: dropped.
        ("How does break-even work?", "Costs = 5 + 3\nIt is where revenue meets cost.", None),
        # Settings such as 'ttl=64' are not equations.
        ("ping host", PING, Task.CHAT),
        # Code continued without its fence (cut off in the previous answer) is code.
        ("continue", CONTINUED_CODE, Task.CODE),
        ("Explain", "See ```x``` and a long prose answer " + "word " * 200, None),
        ("", CODE_ANSWER, None),
        # ShareGPT's empty answers (a lone zero-width space) say nothing: dropped.
        ("Write a story", "\u200b", None),
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
