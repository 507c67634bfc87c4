"""bench/classifier_audit.py: the sample file round trip, its checks and the ceiling."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import classifier_audit as audit
from policies.types import Task
from training.classifier.corpus import Example, user
from training.classifier.dataset import Dataset, build_dataset

Capture = pytest.CaptureFixture[str]


def tiny_dataset() -> Dataset:
    examples = [
        Example(user("Write a Python function that reverses a list."), Task.CODE, "mbpp", "a"),
        Example(user("Write a haiku about the sea."), Task.CHAT, "sharegpt_first", "b"),
        Example(user("What is 12 * 7 + 3?"), Task.MATH, "gsm8k", "c"),
    ]
    return build_dataset(examples, held_out_percent=100)


def write(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def line(dataset: Dataset, index: int, verdict: str) -> dict[str, object]:
    group = audit.group_sha(dataset.examples[index].group)
    return {"index": index, "group_sha": group, "verdict": verdict, "label": "x", "guess": "y"}


def test_ceiling_is_the_accuracy_without_the_readable_errors() -> None:
    ceiling, low, high = audit.ceilings(0.05, 60, 100)
    assert ceiling == pytest.approx(1 - 0.05 * 0.4)
    assert low < ceiling < high
    # 1.96 * sqrt(0.6 * 0.4 / 100) of the error rate either side
    assert high - ceiling == pytest.approx(0.05 * 1.96 * (0.24 / 100) ** 0.5)
    assert audit.ceilings(0.05, 100, 100) == (1.0, 1.0, 1.0)


def test_tally_prints_counts_and_ceiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tiny_dataset()
    verdicts = write(
        tmp_path / "v.jsonl",
        [line(dataset, 0, "readable"), line(dataset, 1, "undetermined"), line(dataset, 2, "label")],
    )
    parser_args = audit.argparse.Namespace(verdicts=verdicts, show=True, error_rate=[0.06])
    assert audit.tally(parser_args, dataset) == 0
    out = capsys.readouterr().out
    assert re.search(r"^readable +1 +33.3%$", out, re.M)
    assert "undetermined: sharegpt_first" in out  # --show names each request's verdict
    assert "would score 96.00%" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json\n", "expected a JSON object"),
        ('{"index": 0}\n', "expected a JSON object"),
        ('{"index": 9, "group_sha": "x", "verdict": "readable"}\n', "is not in the dataset"),
        ('{"index": 0, "group_sha": "0000", "verdict": "readable"}\n', "corpus changed"),
        ("\n", "no verdicts"),
    ],
)
def test_bad_verdict_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "v.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit, match=message):
        audit.read_verdicts(path, tiny_dataset())


def test_unknown_verdict_is_refused(tmp_path: Path) -> None:
    dataset = tiny_dataset()
    path = write(tmp_path / "v.jsonl", [line(dataset, 0, "maybe")])
    with pytest.raises(SystemExit, match="'maybe' is not one of readable, undetermined, label"):
        audit.read_verdicts(path, dataset)


def test_sample_writes_errors_without_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tiny_dataset()
    # Relabel every example so that the built-in classifier gets them all wrong.
    dataset.examples = [
        Example(e.body, Task.CHAT if e.task != Task.CHAT else Task.MATH, e.source, e.group)
        for e in dataset.examples
    ]
    out = tmp_path / "s.jsonl"
    args = audit.argparse.Namespace(artifact=None, validation_percent=0, sample=2, seed=0, out=out)
    assert audit.sample(args, dataset) == 0
    assert "3 errors of 3 real-source requests" in capsys.readouterr().out
    lines = [json.loads(text) for text in out.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 2 and all(line["verdict"] == "" for line in lines)
    assert "Python" not in out.read_text(encoding="utf-8")
    for line_ in lines:
        assert line_["group_sha"] == audit.group_sha(dataset.examples[line_["index"]].group)
