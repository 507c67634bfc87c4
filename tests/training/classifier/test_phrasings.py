"""The #17 training sources: Pygments' source files, phrasings, evaluation sets, calibration."""

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from controller.classifier.combiner import Combiner
from policies.types import Task
from tests.training.classifier.guesses import one_hot_guesses
from training.classifier.corpus import MissingDataError
from training.classifier.evaluation import calibration_error, evaluate, report_json
from training.classifier.phrasings import follow_ups, history_pools, source_file_examples
from training.classifier.prompt_sets import load_prompt_file, request_tags, script_of
from training.classifier.pygments_source import SourceFile, source_files
from training.classifier.split import is_held_out
from training.classifier.stacking import fit_temperature

SHARED_DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
REPO = Path(__file__).resolve().parents[3]


def tiny_sdist(folder: Path) -> Path:
    path = folder / "pygments-0.tar.gz"
    files: dict[str, str | bytes] = {
        "pygments-0/tests/examplefiles/go/main.go": "package main\n\nfunc main() {}\n",
        "pygments-0/tests/examplefiles/go/main.go.output": "tokens",
        "pygments-0/tests/examplefiles/terraform/x.tf": 'resource "a" "b" {\n  c = 1\n}\n',
        "pygments-0/tests/examplefiles/bin/blob": b"\xff\xfe\x00bad",
        "pygments-0/tests/snippets/lua/test_a.txt": "---input---\nlocal x = 1\n\n---tokens---\n'x'",
    }
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text if isinstance(text, bytes) else text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_source_files_read_examples_and_snippets_and_skip_outputs(tmp_path: Path) -> None:
    path = tiny_sdist(tmp_path)
    files = list(source_files(path, sha256=None))
    assert [(f.alias, f.language) for f in files] == [("go", "Go"), ("terraform", "Terraform")]
    snippets = list(source_files(path, "snippets", sha256=None))
    assert [(s.alias, s.text) for s in snippets] == [("lua", "local x = 1")]


def test_a_tarball_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MissingDataError, match="sha256 is not"):
        list(source_files(tiny_sdist(tmp_path)))
    with pytest.raises(MissingDataError, match="make install-test"):
        list(source_files(tmp_path / "absent.tar.gz"))


def test_source_file_examples_are_code_grouped_by_language() -> None:
    import random

    files = [SourceFile("go", "Go", "examplefiles/go/a.go", "package main\nfunc f() {}\n")]
    examples = list(source_file_examples(files, random.Random(0)))
    assert {e.task for e in examples} == {Task.CODE}
    assert {e.group for e in examples} == {"pygments/go"}
    assert examples[0].body == {"prompt": files[0].text}
    assert all("func f()" in e.body["messages"][0]["content"] for e in examples[1:])


def test_follow_up_histories_come_from_the_same_side_of_the_split() -> None:
    import random

    from training.classifier.corpus import read_jsonl

    rows = list(read_jsonl(SHARED_DATA / "mbpp" / "mbpp.jsonl"))
    by_text: dict[str, set[str]] = {}
    for row in rows:  # a few MBPP texts belong to more than one task
        by_text.setdefault(row["text"], set()).add(f"mbpp/{row['task_id']}")
    examples = list(follow_ups(history_pools(SHARED_DATA, rows), random.Random(0)))
    assert {e.task for e in examples} == {Task.CODE, Task.MATH}
    for example in examples:
        question = example.body["messages"][0]["content"]
        groups = by_text.get(question, {question})  # GSM8K's group is the question
        assert is_held_out(example.group) in {is_held_out(group) for group in groups}


def test_script_of() -> None:
    assert script_of("Solve 2x + 3 = 7") == "latin"
    assert script_of("求函数的极值") == "cjk"
    assert script_of("方程式を解いてください") == "japanese"
    assert script_of("Решите уравнение") == "cyrillic"
    assert script_of("방정식을 푸세요") == "korean"
    assert script_of("1 + 1") == "none"


def test_prompt_file_tags_and_per_category_report(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [
        {"task": "math", "human_language": "de", "messages": [{"role": "user", "content": "x"}]},
        {"task": "code", "programming_language": "go", "prompt": "package main"},
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    examples = load_prompt_file(path)
    assert request_tags(examples[0]) == (("human_language", "de"),)

    class Always:
        def classify(self, body: object) -> object:
            from controller.classifier.base import TaskGuess

            return TaskGuess(Task.MATH, 0.75, {Task.MATH: 0.75}, 0.0)

    document = report_json(evaluate(Always(), examples))  # type: ignore[arg-type]
    assert document["categories"]["human_language"]["de"]["accuracy"] == 1.0
    assert document["categories"]["programming_language"]["go"]["accuracy"] == 0.0
    assert document["calibration_error"] == pytest.approx(0.25)
    path.write_text('{"task": "poetry", "prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:1"):
        load_prompt_file(path)


def test_committed_prompt_set_loads_with_every_task() -> None:
    examples = load_prompt_file(REPO / "bench" / "classifier_prompts" / "handwritten.jsonl")
    assert {e.task for e in examples} == {Task.MATH, Task.CODE, Task.CHAT}
    assert len(examples) == 145


def test_calibration_error_of_perfectly_calibrated_guesses_is_zero() -> None:
    assert calibration_error([(0.95, True)] * 19 + [(0.95, False)]) == pytest.approx(0.0)
    assert calibration_error([(1.0, False)]) == pytest.approx(1.0)


def test_temperature_softens_an_over_confident_combiner() -> None:
    # logits that pick the right class 70% of the time, with a margin of 6 (over-confident)
    features, labels = one_hot_guesses(600, 0.7)
    combiner = Combiner(np.eye(8)[:3] * 1.0, np.zeros(3), np.eye(3) * 6.0, np.zeros(3))
    assert fit_temperature(combiner, features, labels) > 2.0


def tiny_chatterbot_sdist(folder: Path) -> Path:
    path = folder / "chatterbot_corpus-1.3.3.tar.gz"
    files = {
        "c/chatterbot_corpus/data/korean/science.yml": (
            "\ufeffcategories:\n- science\nconversations:\n- - 파장이 무엇이니\n  - 파장입니다.\n"
            "  - 고마워\n  - 천만에요.\n"
        ),
        "c/chatterbot_corpus/data/russian/food.yml": "conversations:\n- - Привет!\n",
        "c/chatterbot_corpus/data/README.yml": "conversations:\n- - not a language folder\n",
    }
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_chatterbot_user_lines_are_single_turn_chat_grouped_by_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.classifier import chatterbot_source

    tiny_chatterbot_sdist(tmp_path)
    with pytest.raises(MissingDataError, match="sha256 is not"):
        list(chatterbot_source.chatterbot_examples(tmp_path))
    monkeypatch.setattr(
        chatterbot_source, "sdist_sha256", lambda path: chatterbot_source.SDIST.sha256
    )
    examples = list(chatterbot_source.chatterbot_examples(tmp_path))
    assert [e.body["messages"][-1]["content"] for e in examples] == [
        "파장이 무엇이니",
        "고마워",
        "Привет!",
    ]
    assert [len(e.body["messages"]) for e in examples] == [1, 1, 1]
    assert {e.task for e in examples} == {Task.CHAT} and {e.source for e in examples} == {
        "chatterbot"
    }
    korean, russian = "chatterbot/korean/science.yml", "chatterbot/russian/food.yml"
    assert [e.group for e in examples] == [korean, korean, russian]
