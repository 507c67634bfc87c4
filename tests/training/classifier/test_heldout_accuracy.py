"""The committed artifact on the held-out split (never trained on, never used to choose a
model), every source including ShareGPT, against the committed evaluation JSON
(``draftctl classifier eval --prompts bench/classifier_prompts/handwritten.jsonl --prompts
bench/classifier_prompts/cyrillic.jsonl --prompts bench/classifier_prompts/korean.jsonl
--prompts bench/classifier_prompts/japanese.jsonl --snippets --json
bench/results/classifier_eval_2026-12-02_h20.json``), and on the committed hand-written
prompts (English and others; Russian and Ukrainian; Korean; Japanese) and the Pygments
snippets (never trained on).

Each source must reach its committed accuracy minus that figure's noise (two standard errors
of a proportion measured on that many requests, ``source_noise``): a retrained artifact may
move within the noise, not beyond it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controller.classifier import load_classifier
from training.classifier.dataset import load_dataset
from training.classifier.evaluation import evaluate, report_json

ROOT = Path(__file__).resolve().parents[3]
SHARED_DATA = ROOT.parent / "shared" / "data"
COMMITTED = ROOT / "bench" / "results" / "classifier_eval_2026-12-02_h20.json"
PROMPT_FILES = [
    ROOT / "bench" / "classifier_prompts" / name
    for name in ("handwritten.jsonl", "cyrillic.jsonl", "korean.jsonl", "japanese.jsonl")
]
SOURCES = sorted(json.loads(COMMITTED.read_text())["sources"])

pytestmark = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"{SHARED_DATA} not present")


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(COMMITTED.read_text())
    assert data["split"] == "held-out" and data["artifact"] == "built-in"
    return data


@pytest.fixture(scope="module")
def live() -> dict[str, Any]:
    dataset = load_dataset(SHARED_DATA)
    examples = [dataset.examples[i] for i in dataset.eval_rows(0)]
    return report_json(evaluate(load_classifier(), examples))


def test_the_split_is_the_committed_one(live: dict[str, Any], committed: dict[str, Any]) -> None:
    totals = {name: cell["total"] for name, cell in live["sources_by_label"].items()}
    assert totals == {name: cell["total"] for name, cell in committed["sources_by_label"].items()}
    assert {"sharegpt_first", "sharegpt_later", "mt_bench", "gsm8k", "mbpp"} <= set(SOURCES)


@pytest.mark.parametrize("source", SOURCES)
def test_each_source_holds_its_measured_accuracy(
    live: dict[str, Any], committed: dict[str, Any], source: str
) -> None:
    measured = committed["sources"][source]
    floor = measured["accuracy"] - measured["noise"]
    got = live["sources"][source]
    assert got["accuracy"] >= floor, (source, got, f"floor {floor:.4f}")


def test_prompt_sets_hold_their_measured_accuracy(committed: dict[str, Any]) -> None:
    """The hand-written prompts and the Pygments snippets, overall and per task."""
    from training.classifier.prompt_sets import load_prompt_file, snippet_examples
    from training.classifier.pygments_source import fetch_sdist

    sets = {str(path.relative_to(ROOT)): load_prompt_file(path) for path in PROMPT_FILES}
    sets["pygments snippets"] = snippet_examples(fetch_sdist())
    for name, examples in sets.items():
        measured = committed["prompt_sets"][name]
        live = report_json(evaluate(load_classifier(), examples))
        assert live["examples"] == measured["examples"], name
        for task, cell in measured["categories"]["task"].items():
            got = live["categories"]["task"][task]["accuracy"]
            assert got >= cell["accuracy"] - cell["noise"], (name, task, got, cell)
