"""Training on a tiny corpus, and the artifact round trip (no pickle)."""

import re
from pathlib import Path

import numpy as np
import pytest

from controller.classifier.artifact import ArtifactError, load_classifier, save_artifact
from controller.classifier.corpus import Example, user
from controller.classifier.dataset import build_dataset
from controller.classifier.features import FeatureSpec
from controller.classifier.training import TrainSettings, fit
from policies.types import Task

MATH = ["Solve 3x + 5 = 20 for x.", "What is 17 * 23?", "Compute the integral of x^2 dx."]
CODE = [
    "Write a Python function to reverse a list.",
    "def fib(n):\n    ",
    "Fix: for i in range(10) print(i)",
]
CHAT = ["Tell me a story about a cat.", "How are you today?", "Write a poem about the sea."]


def tiny_dataset():  # type: ignore[no-untyped-def]
    examples = [
        Example(user(text), task, "tiny", f"{task}-{i}")
        for task, texts in ((Task.MATH, MATH), (Task.CODE, CODE), (Task.CHAT, CHAT))
        for i, text in enumerate(texts)
    ]
    return build_dataset(examples, held_out_percent=0)


def test_fit_learns_a_tiny_corpus_and_survives_the_round_trip(tmp_path: Path) -> None:
    settings = TrainSettings(spec=FeatureSpec(num_bits=12), alpha=1e-4, num_epochs=50)
    model = fit(tiny_dataset(), settings)
    for task, texts in ((Task.MATH, MATH), (Task.CODE, CODE), (Task.CHAT, CHAT)):
        assert [model.classify(user(t)).task for t in texts] == [task] * 3
    save_artifact(model, tmp_path, {"note": "test"})
    loaded = load_classifier(tmp_path)
    for text in MATH + CODE + CHAT:
        before, after = model.classify(user(text)), loaded.classify(user(text))
        assert before.task == after.task
        assert np.isclose(before.confidence, after.confidence, atol=1e-3)  # float16 weights


def test_same_seed_gives_the_same_weights() -> None:
    settings = TrainSettings(spec=FeatureSpec(num_bits=10), num_epochs=5)
    first, second = fit(tiny_dataset(), settings), fit(tiny_dataset(), settings)
    assert np.array_equal(first.weights, second.weights)


def test_duplicates_are_dropped_and_counted() -> None:
    examples = [Example(user("same"), Task.CHAT, "s", group) for group in ("g1", "g2")]
    dataset = build_dataset(examples)
    assert len(dataset.texts) == 1 and dataset.num_duplicates == 1


def test_missing_or_mismatched_artifact_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=re.escape(str(tmp_path))):
        load_classifier(tmp_path)
    model = fit(tiny_dataset(), TrainSettings(spec=FeatureSpec(num_bits=8), num_epochs=2))
    save_artifact(model, tmp_path, {})
    manifest = tmp_path / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"num_bits": 8', '"num_bits": 9'))
    with pytest.raises(ArtifactError, match=r"weights\.npz"):
        load_classifier(tmp_path)
