"""The committed artifact: robustness cases with defined answers (docs/classifier.md)."""

import numpy as np
import pytest

from controller.classifier import apply_threshold, load_classifier
from controller.classifier.features import bucket_indexes, text_bytes, word_buckets
from controller.classifier.model import LinearClassifier
from policies.types import Task


@pytest.fixture(scope="module")
def classifier() -> LinearClassifier:
    return load_classifier()


def ask(classifier: LinearClassifier, text: str) -> Task:
    return classifier.classify({"messages": [{"role": "user", "content": text}]}).task


def test_empty_or_textless_requests_are_chat_with_zero_confidence(
    classifier: LinearClassifier,
) -> None:
    for body in ({"messages": []}, {"prompt": ""}, {"prompt": [1, 2, 3]}, {}):
        guess = classifier.classify(body)
        assert (guess.task, guess.confidence) == (Task.CHAT, 0.0)
        assert apply_threshold(guess, 0.55, Task.CODE).task == Task.CODE


def test_huge_prompt_is_truncated_and_still_classified(classifier: LinearClassifier) -> None:
    block = (
        "import json\n\n\nclass Store:\n    def __init__(self, path):\n        self.path = path\n\n"
        "    def load(self):\n        with open(self.path) as handle:\n"
        "            return json.load(handle)\n\n"
    )
    guess = classifier.classify({"prompt": block * 100_000})  # ~17 MB
    assert guess.task == Task.CODE


@pytest.mark.parametrize(
    ("text", "task"),
    [
        ("Bonjour ! Peux-tu me conseiller un bon livre à lire pendant les vacances ?", Task.CHAT),
        ("请帮我写一封感谢信给我的老师，感谢她这一年的帮助。", Task.CHAT),
        ("Wie kann ich meine Zeit besser organisieren, wenn ich viel Stress habe?", Task.CHAT),
    ],
)
def test_non_english_chat_is_chat(classifier: LinearClassifier, text: str, task: Task) -> None:
    assert ask(classifier, text) == task


def test_code_pasted_into_a_chat_question_is_code(classifier: LinearClassifier) -> None:
    text = (
        "Hi! My script crashes and I don't understand why, can you help me fix it?\n\n"
        "```python\nimport json\n\ndef load(path):\n    with open(path) as f:\n"
        "        return json.load(f)['items']\n\nprint(load('data.json')[0])\n```\n"
        "It says KeyError: 'items'."
    )
    assert ask(classifier, text) == Task.CODE


def test_scores_are_probabilities(classifier: LinearClassifier) -> None:
    guess = classifier.classify({"prompt": "Solve for x: 2x + 3 = 11."})
    assert guess.task == Task.MATH
    assert abs(sum(guess.scores.values()) - 1.0) < 1e-9
    assert guess.confidence == max(guess.scores.values())
    assert guess.latency_s > 0


CODE_ANSWER = (
    "Here is the function:\n```python\ndef load(path):\n    with open(path) as f:\n"
    "        return json.load(f)\n```\nIt reads the file and parses it."
)
PROSE_ANSWER = (
    "The French Revolution began in 1789 and reshaped politics across Europe. It ended the "
    "monarchy and spread ideas of citizenship."
)


@pytest.mark.parametrize(
    ("first", "answer", "last", "task"),
    [
        # A bare follow-up continues in the style of the previous answer...
        ("Write a Python function that loads a JSON file", CODE_ANSWER, "continue", Task.CODE),
        ("Tell me about the French Revolution", PROSE_ANSWER, "continue", Task.CHAT),
        # ...while a self-contained request is read on its own (docs/classifier.md).
        (
            "Write a Python function that loads a JSON file",
            CODE_ANSWER,
            "Thanks! Now write a short poem about autumn leaves.",
            Task.CHAT,
        ),
        (
            "Tell me about the French Revolution",
            PROSE_ANSWER,
            "Write a Python script that prints the years of the revolution",
            Task.CODE,
        ),
    ],
)
def test_follow_ups_use_the_context_and_topic_switches_do_not(
    classifier: LinearClassifier, first: str, answer: str, last: str, task: Task
) -> None:
    messages = [
        {"role": "user", "content": first},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": last},
    ]
    assert classifier.classify({"messages": messages}).task == task


def test_byte_histogram_scores_equal_the_gathered_sum(classifier: LinearClassifier) -> None:
    text = "Ünïcode, code: def f(x):\n    return x ** 2  # and prose\n" * 30
    for segment in (0, 1):
        buckets = bucket_indexes(text, classifier.spec, segment)
        weights = classifier.weights.astype(np.float64)
        gathered = weights[:, buckets].sum(axis=1) / np.sqrt(buckets.size)
        # The word view (its own normalisation) is added to the segment's score.
        words = word_buckets(text_bytes(text, classifier.spec), classifier.spec, segment)
        if words.size:
            gathered += weights[:, words].sum(axis=1) / np.sqrt(words.size)
        scores, num_ngrams = classifier.segment_scores(text, segment)
        assert num_ngrams == buckets.size
        # float32 weights summed in another order: ~1e-5 relative (scores reach ~500 here).
        assert np.allclose(scores, gathered, rtol=1e-4, atol=1e-4)
