"""The committed artifact on held-out prompts of ../shared/data (never used in training)."""

from pathlib import Path

import pytest

from controller.classifier import load_classifier
from training.classifier.corpus import gsm8k, math500, mbpp, mt_bench
from training.classifier.dataset import build_dataset
from training.classifier.evaluation import evaluate

SHARED_DATA = Path(__file__).resolve().parents[4] / "shared" / "data"

pytestmark = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"{SHARED_DATA} not present")


def held_out(loader):  # type: ignore[no-untyped-def]
    dataset = build_dataset(loader(SHARED_DATA))
    return [dataset.examples[i] for i in dataset.subset(is_test=True)]


@pytest.mark.parametrize(
    ("loader", "min_accuracy"),
    # MT-Bench has 38 held-out requests (one is 2.6 points): the committed artifact gets 30
    # (78.9%; it misses 5 of 6 maths ones, docs/classifier.md), the previous one got 32.
    [(gsm8k, 0.98), (mbpp, 0.98), (math500, 0.85), (mt_bench, 0.75)],
)
def test_held_out_accuracy(loader, min_accuracy: float) -> None:  # type: ignore[no-untyped-def]
    examples = held_out(loader)[:400]
    assert len(examples) >= 20
    report = evaluate(load_classifier(), examples)
    assert report.accuracy >= min_accuracy, report.per_source
