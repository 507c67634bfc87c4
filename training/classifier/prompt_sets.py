"""Evaluation sets from sources that training never reads (#17).

- **Prompt files** (``classifier eval --prompts FILE``): JSON lines with ``task``,
  ``messages`` (or ``prompt``) and category fields (``human_language``,
  ``programming_language``, ``register``, ``turns``); ``bench/classifier_prompts/
  handwritten.jsonl`` is the committed one (docs/classifier.md says how it was written).
- **Pygments snippets** (``--snippets``): the ``tests/snippets`` inputs of the Pygments sdist
  (training reads only ``tests/examplefiles``), each as a completions prompt and as a chat
  message pasted without a word around it; all ``code``.

Every example carries ``tags`` (category -> value) for the per-category report; the split
examples get theirs from :func:`request_tags`.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

from controller.classifier.text import request_segments
from policies.types import Task
from training.classifier.corpus import Example, MissingDataError, user
from training.classifier.pygments_source import source_files

CATEGORY_FIELDS = ("human_language", "programming_language", "register", "turns")


def load_prompt_file(path: Path) -> list[Example]:
    """The examples of a prompt file; a bad line raises ValueError naming FILE:LINE."""
    if not path.is_file():
        raise MissingDataError(f"{path}: not found (--prompts takes a JSON-lines file)")
    examples = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            examples.append(prompt_example(json.loads(line), f"{path.stem}:{number}"))
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: {error}") from error
    return examples


def prompt_example(row: dict[str, Any], group: str) -> Example:
    body = {"messages": row["messages"]} if "messages" in row else {"prompt": row["prompt"]}
    tags = tuple((name, str(row[name])) for name in CATEGORY_FIELDS if row.get(name))
    return Example(body, Task(row["task"]), "prompts", group, tags=tags)


def snippet_examples(sdist: Path) -> list[Example]:
    """Each Pygments snippet as a completions prompt and as a bare chat message (code)."""
    examples = []
    for source in source_files(sdist, "snippets"):
        tags = (("programming_language", source.alias),)
        group = f"snippet/{source.path}"
        examples.append(Example({"prompt": source.text}, Task.CODE, "snippets", group, tags=tags))
        register = (*tags, ("register", "pasted, no words"))
        examples.append(Example(user(source.text), Task.CODE, "snippets", group, tags=register))
    return examples


def request_tags(example: Example) -> tuple[tuple[str, str], ...]:
    """The example's own tags, else ``turns`` and the writing ``script`` of its last turn."""
    if example.tags:
        return example.tags
    focus, context = request_segments(example.body)
    turns = "multi" if "messages" in example.body and context else "single"
    return (("turns", turns), ("script", script_of(focus)))


def script_of(text: str) -> str:
    """The main writing system of ``text``'s letters: latin, cjk (Han), japanese (kana),
    korean, cyrillic, other; 'none' without letters."""
    counts: dict[str, int] = {}
    for char in text[:2000]:
        if not char.isalpha():
            continue
        name = unicodedata.name(char, "")
        if char.isascii() or name.startswith("LATIN"):
            script = "latin"
        elif name.startswith(("HIRAGANA", "KATAKANA")):
            script = "japanese"
        elif name.startswith("CJK"):
            script = "cjk"
        elif name.startswith("HANGUL"):
            script = "korean"
        elif name.startswith("CYRILLIC"):
            script = "cyrillic"
        else:
            script = "other"
        counts[script] = counts.get(script, 0) + 1
    if not counts:
        return "none"
    if counts.get("japanese") and counts.get("cjk"):
        return "japanese"  # Japanese mixes Han and kana
    return max(counts, key=lambda key: counts[key])
