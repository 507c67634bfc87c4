"""Tool requests and maths problems in five non-Latin-script languages
(``foreign_requests.py``, #17 fourth follow-up)."""

from collections import Counter

from policies.types import Task
from training.classifier.foreign_requests import (
    MATH_SOURCE,
    NUM_PER_MATH_TOPIC,
    TOOL_SOURCE,
    foreign_examples,
)
from training.classifier.foreign_tables import MATH_TOPICS, TOOL_OPENERS, TOOL_REQUESTS
from training.classifier.prompt_sets import script_of

SCRIPTS = {"ru": "cyrillic", "uk": "cyrillic", "ja": "japanese", "ko": "korean", "zh": "cjk"}


def is_written_in(text: str, language: str) -> bool:
    """Some letters of the language's script (tool names and SQL stay in Latin letters)."""
    return any(script_of(char) == SCRIPTS[language] for char in text) or (
        language == "ja" and script_of(text) == "japanese"
    )


def test_tool_requests_are_code_grouped_by_language_and_tool() -> None:
    tools = [example for example in foreign_examples() if example.source == TOOL_SOURCE]
    assert {example.task for example in tools} == {Task.CODE}
    written = sum(
        len(requests) for by_tool in TOOL_REQUESTS.values() for requests in by_tool.values()
    )
    assert len(tools) == 2 * written  # as written, and behind an opener of the language
    for example in tools:
        _, language, tool, _ = example.group.replace("tool-", "").split("/")
        text = example.body["messages"][-1]["content"]
        assert any(text == opener + request for opener in TOOL_OPENERS[language]
                   for request in TOOL_REQUESTS[language][tool])  # fmt: skip
        assert is_written_in(text, language)


def test_maths_problems_are_maths_with_numbers_filled_in() -> None:
    maths = [example for example in foreign_examples() if example.source == MATH_SOURCE]
    assert {example.task for example in maths} == {Task.MATH}
    per_group = Counter(example.group for example in maths)
    assert len(per_group) == sum(len(problems) for problems in MATH_TOPICS.values())
    assert set(per_group.values()) == {NUM_PER_MATH_TOPIC}
    for example in maths:
        text = example.body["messages"][-1]["content"]
        assert "{" not in text
        assert is_written_in(text, example.group.split("-")[-1].split("/")[0])


def test_seeded() -> None:
    assert list(foreign_examples()) == list(foreign_examples())
