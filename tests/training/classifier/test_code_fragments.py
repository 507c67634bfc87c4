"""Bare fragments of the Pygments example files (``code_fragments.py``)."""

from policies.types import Task
from training.classifier.code_fragments import (
    MAX_FRAGMENT_CHARS,
    NUM_LINES,
    NUM_PER_FILE,
    SOURCE,
    fragment_examples,
)
from training.classifier.corpus import Example
from training.classifier.pygments_source import SourceFile


def text_of(example: Example) -> str:
    body = example.body
    return str(body["prompt"] if "prompt" in body else body["messages"][-1]["content"])


def test_fragments_are_short_bare_code_from_the_file_grouped_by_language() -> None:
    text = "\n".join(f"local x{i} = {i}" for i in range(50))
    files = [SourceFile("lua", "Lua", "examplefiles/lua/a.lua", text)]
    examples = list(fragment_examples(files))
    assert 0 < len(examples) <= NUM_PER_FILE
    for example in examples:
        assert (example.task, example.source, example.group) == (Task.CODE, SOURCE, "pygments/lua")
        fragment = text_of(example)
        assert fragment in text and len(fragment) <= MAX_FRAGMENT_CHARS
        assert fragment.count("\n") < max(NUM_LINES)
    assert examples == list(fragment_examples(files)), "seeded"


def test_pieces_shorter_than_three_characters_are_skipped() -> None:
    files = [SourceFile("text", "Text", "examplefiles/text/a.txt", "x\n\n\n\n\n\n\n\n\n")]
    assert list(fragment_examples(files)) == []
