"""ShareGPT conversations as labelled classifier examples.

The package ships a truncated JSON array, so records are decoded one at a time with
``json.JSONDecoder.raw_decode`` until the first incomplete one.

ShareGPT is mostly chat but mixes in coding and maths requests. Each human turn is labelled
from what the drafter would have had to produce, i.e. the assistant answer that follows it,
by these rules (first match wins; see docs/classifier.md):

1. code: fenced code blocks make up at least ``MIN_CODE_FRACTION`` of the answer;
2. chat: the answer has no backtick at all (no fence, no inline code), and neither turn
   shows code syntax nor the human turn a maths cue;
3. anything else is ambiguous and left out (counted in the training manifest). This includes
   every maths-looking turn: a sample of them showed more word problems about business,
   dosing or logistics answered in prose than worked derivations, so ShareGPT contributes
   no maths labels (GSM8K, MATH-500, CHAMP and MT-Bench do).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.types import Task

MIN_CODE_FRACTION = 0.5
FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
CODE_SYNTAX = re.compile(
    r"```|\bdef \w+\(|\bclass \w+[:({]|^\s*import \w+|^\s*from \w+ import|#include\s*<"
    r"|\bfunction\s*\w*\(|=>|\bconsole\.log|\bpublic static\b|\bSELECT\b[^\n]*\bFROM\b"
    r"|</?(?:div|span|html|script|body)\b|;\s*$|\{\s*$|^\s*\}|\$\w+\s*=|\w+\(\)\s*[;{]",
    re.M,
)
MATH_CUE = re.compile(
    r"\\frac|\\int|\\sum|\\sqrt|\bsolve\b|\bequations?\b|\bintegral\b|\bderivative\b"
    r"|\bprobability\b|\bcalculate\b|\bhow many\b|\d\s*[-+*/^×÷]\s*\d|\d\s*=\s*\d"
    r"|\bx\s*[=+\-]\s*\d",
    re.I,
)


@dataclass(frozen=True)
class Turn:
    """One human turn with the conversation before it and the answer after it."""

    conversation_id: str
    messages: tuple[dict[str, str], ...]  # OpenAI-style, ending with the human turn
    answer: str


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """Decode the records of a (possibly truncated) JSON array, one at a time."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    skip = re.compile(r"[\s,]*")
    index = text.index("[") + 1
    while True:
        index = skip.match(text, index).end()  # type: ignore[union-attr]
        if index >= len(text) or text[index] == "]":
            return
        try:
            record, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            return  # the truncated tail
        if isinstance(record, dict):
            yield record


def iter_turns(record: dict[str, Any]) -> Iterator[Turn]:
    conversation_id = str(record.get("id", "")).split("_")[0]
    messages: list[dict[str, str]] = []
    conversation = record.get("conversations") or []
    for position, message in enumerate(conversation):
        role = {"human": "user", "user": "user", "gpt": "assistant"}.get(message.get("from"))
        value = message.get("value")
        if role is None or not isinstance(value, str):
            continue
        messages.append({"role": role, "content": value})
        following = conversation[position + 1] if position + 1 < len(conversation) else None
        if role == "user" and following and following.get("from") == "gpt":
            yield Turn(conversation_id, tuple(messages), str(following.get("value", "")))


def fenced_fraction(answer: str) -> float:
    if not answer:
        return 0.0
    return sum(len(block) for block in FENCE.findall(answer)) / len(answer)


def label_turn(prompt: str, answer: str) -> Task | None:
    """The task of a human turn by the module's rules, or None when it is ambiguous."""
    if not prompt.strip() or not answer.strip():
        return None
    if fenced_fraction(answer) >= MIN_CODE_FRACTION:
        return Task.CODE
    if "`" in answer or CODE_SYNTAX.search(prompt) or CODE_SYNTAX.search(answer):
        return None
    if MATH_CUE.search(prompt):
        return None
    return Task.CHAT
