"""Validate YAML text against a pydantic model, reporting problems by dotted key and line.

Both the daemon config and the policy file go through here, so every error a person sees
has the same shape: ``<dotted.key>: <message> (line N)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Problem:
    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line is not None else ""
        return f"{self.path or '<root>'}: {self.message}{where}"

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "message": self.message, "line": self.line}


class InvalidDocument(ValueError):
    """Raised when a YAML document does not validate; carries every problem found."""

    def __init__(self, problems: list[Problem]):
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


def _line_index(node: yaml.Node, prefix: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    out[prefix] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = (*prefix, str(key_node.value))
            out[key] = key_node.start_mark.line + 1
            _line_index(value_node, key, out)
            out[key] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, (*prefix, str(i)), out)


def _nearest_line(lines: dict[tuple[str, ...], int], loc: tuple[str, ...]) -> int | None:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _data_loc(data: Any, loc: tuple[str, ...]) -> tuple[str, ...]:
    """Drop loc segments that are not keys of the document (pydantic's union tags such as
    ``backends.0.vllm.urls``), keeping the last one (a missing or unknown key)."""
    kept: list[str] = []
    for i, part in enumerate(loc):
        if isinstance(data, dict) and part not in data and i < len(loc) - 1:
            continue
        kept.append(part)
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            data = None
    return tuple(kept)


def _message(error: dict[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key"
    msg = str(error["msg"])
    if error["type"] not in ("missing",) and "input" in error:
        value = error["input"]
        if not isinstance(value, dict | list):
            msg += f" (got {value!r})"
    return msg


def parse_yaml(text: str) -> tuple[Any, dict[tuple[str, ...], int]]:
    """Parse YAML text; returns the data and a map from key path to line number."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidDocument([Problem("", f"invalid YAML: {problem}", line)]) from exc
    lines: dict[tuple[str, ...], int] = {}
    if node is not None:
        _line_index(node, (), lines)
    return data, lines


def validate_yaml(model: type[M], text: str, context: dict[str, Any] | None = None) -> M:
    """Parse and validate ``text`` as ``model``; raise InvalidDocument listing every problem."""
    data, lines = parse_yaml(text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidDocument([Problem("", "the document must be a mapping of keys", 1)])
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = _data_loc(data, tuple(str(p) for p in error["loc"]))
            problems.append(
                Problem(".".join(loc), _message(dict(error)), _nearest_line(lines, loc))
            )
        raise InvalidDocument(problems) from exc
