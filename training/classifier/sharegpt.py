"""ShareGPT conversations as labelled classifier examples.

The package ships a truncated JSON array, so records are decoded one at a time with
``json.JSONDecoder.raw_decode`` until the first incomplete one.

ShareGPT is mostly chat but mixes in coding and maths requests. Each human turn is labelled
from what the drafter would have had to produce, i.e. the assistant answer that follows it,
by these rules (first match wins; see docs/classifier.md):

0. dropped: an empty human turn, or an answer without a letter or digit (ShareGPT has many
   answers that are a lone zero-width space);
1. code: code makes up at least ``MIN_CODE_FRACTION`` of the answer's characters, counting
   fenced blocks and, outside fences, lines that look like code (``CODE_LINE``: a
   continuation answer often carries its code without the fence it was cut from);
2. math: at least ``MIN_EQUATION_LINES`` lines, and ``MIN_EQUATION_FRACTION`` of the
   answer's non-empty lines, are worked equations (``EQUATION_LINE``: a numeric relation
   such as ``20672 = 2 x 8512 + 3096``, a product of numbers, or LaTeX), not code;
3. chat: the answer has no backtick at all, neither turn shows code syntax, the answer has
   fewer than two code-like lines and no equation line;
4. anything else is ambiguous and left out (counted in the training manifest), e.g. prose
   with one formula, or an explanation quoting a little inline code.
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
# A line of code outside a fence: a statement keyword, a brace, a trailing ';' or '{', or an
# assignment from a call, index or string.
CODE_LINE = re.compile(
    r"^\s*(?:def |class \w|import \w|from [\w.]+ import|return\b|elif\b|else\s*:|if\b.*:\s*$"
    r"|for\b.*:\s*$|while\b.*:\s*$|with\b.*:\s*$|try\s*:|except\b|print\(|const |let |var "
    r"|function\b|public |private |#include|using \w|package \w|\}|\{)"
    r"|[;{]\s*$|^\s*[\w.\[\]'\"]+\s*[-+*/]?=\s*[^=\n]*[(\[\"'][^\n]*$",
)
# A worked-equation line: '= 3', '3 =', '4 * 3', '2^5', or a LaTeX maths command...
EQUATION_LINE = re.compile(
    r"[=≈]\s*[-−$(]?\s*\d|\d\s*[=≈]|\\(?:frac|sqrt|cdot|times|sum|int|pi|theta)\b"
    r"|\d\s*[×*÷^]\s*\(?\d"
)
# ...but not a list of settings such as 'icmp_seq=1 ttl=64' (terminal output, config).
KEY_VALUES = re.compile(r"\w=\w[^\n]*\w=\w")
MIN_EQUATION_LINES = 3
MIN_EQUATION_FRACTION = 0.3
HAS_WORD = re.compile(r"\w")


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


def nonempty_lines(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.strip()]


def code_lines_outside_fences(answer: str) -> list[str]:
    return [line for line in nonempty_lines(FENCE.sub("\n", answer)) if CODE_LINE.search(line)]


def code_fraction(answer: str) -> float:
    """Fenced blocks plus code-like lines outside fences, as a fraction of the answer."""
    if not answer:
        return 0.0
    unfenced = sum(len(line) for line in code_lines_outside_fences(answer))
    return fenced_fraction(answer) + unfenced / len(answer)


def equation_lines(answer: str) -> tuple[int, int]:
    """``(equation lines, non-empty lines)`` of the answer, fences opened."""
    lines = nonempty_lines(answer.replace("```", "\n"))
    equations = [
        line
        for line in lines
        if EQUATION_LINE.search(line) and not CODE_LINE.search(line)
        and not KEY_VALUES.search(line)
    ]  # fmt: skip
    return len(equations), len(lines)


def label_turn(prompt: str, answer: str) -> Task | None:
    """The task of a human turn by the module's rules, or None when it is ambiguous."""
    if not prompt.strip() or not HAS_WORD.search(answer):
        return None
    if code_fraction(answer) >= MIN_CODE_FRACTION:
        return Task.CODE
    num_equations, num_lines = equation_lines(answer)
    if num_equations >= MIN_EQUATION_LINES and num_equations >= MIN_EQUATION_FRACTION * num_lines:
        return Task.MATH
    if "`" in answer or CODE_SYNTAX.search(prompt) or CODE_SYNTAX.search(answer):
        return None
    if num_equations or len(code_lines_outside_fences(answer)) >= 2:
        return None
    return Task.CHAT
