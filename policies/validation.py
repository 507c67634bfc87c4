"""Validate YAML text against a pydantic model, reporting problems by dotted key and line.

Both the daemon config and the policy file go through here, so every error a person sees
has the same shape: ``<dotted.key>: <message> (line N)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.composer import ComposerError

M = TypeVar("M", bound=BaseModel)

# What one YAML document may expand to. Configs and policies hold a few hundred values a few
# levels deep; these bounds keep an alias bomb or a deep nest from freezing the process.
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 64


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


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_bounds(node: yaml.Node, depth: int, seen: dict[int, tuple[int, int]]) -> int:
    """Height of ``node``; raises InvalidDocument past MAX_YAML_VALUES values or
    MAX_YAML_DEPTH levels counted with aliases expanded. Linear in the parsed nodes: an
    aliased node is measured once (``seen``: id -> (values, height)) however often it is used."""
    known = seen.get(id(node))
    if known is None:
        if depth > MAX_YAML_DEPTH:
            raise _bounds_problem(node, f"it nests deeper than {MAX_YAML_DEPTH} levels")
        values, height = 1, 1
        for child in _children(node):
            height = max(height, 1 + _check_bounds(child, depth + 1, seen))
            values += seen[id(child)][0]
            if values > MAX_YAML_VALUES:
                raise _bounds_problem(node, f"it holds over {MAX_YAML_VALUES} values")
        known = seen[id(node)] = (values, height)
    if depth + known[1] - 1 > MAX_YAML_DEPTH:
        raise _bounds_problem(node, f"it nests deeper than {MAX_YAML_DEPTH} levels")
    return known[1]


def _bounds_problem(node: yaml.Node, what: str) -> InvalidDocument:
    message = f"invalid YAML: {what} (aliases expanded); write the values out plainly"
    return InvalidDocument([Problem("", message, node.start_mark.line + 1)])


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that stops composing past ``MAX_YAML_DEPTH`` levels, long before Python's
    recursion limit (and without the seconds a RecursionError takes to unwind there)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                problem = f"it nests deeper than {MAX_YAML_DEPTH} levels"
                raise ComposerError(None, None, problem, self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _load(text: str) -> tuple[yaml.Node | None, Any]:
    """Compose, check the bounds, then construct: one parse, nothing built past the bounds."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        values_seen: dict[int, tuple[int, int]] = {}
        _check_bounds(node, 1, values_seen)
        return node, loader.construct_document(node)
    finally:
        loader.dispose()


def parse_yaml(text: str) -> tuple[Any, dict[tuple[str, ...], int]]:
    """Parse YAML text; returns the data and a map from key path to line number.

    Bounded: a document that, with aliases expanded, holds more than ``MAX_YAML_VALUES``
    values or nests deeper than ``MAX_YAML_DEPTH`` is refused before it is built (a few
    hundred bytes of aliases can otherwise expand to billions of values and hold the CPU for
    minutes). Every failure is an InvalidDocument, never another exception.
    """
    try:
        node, data = _load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidDocument([Problem("", f"invalid YAML: {problem}", line)]) from exc
    except RecursionError:
        message = f"invalid YAML: it nests deeper than {MAX_YAML_DEPTH} levels"
        raise InvalidDocument([Problem("", message)]) from None
    except InvalidDocument:
        raise
    except ValueError as exc:  # a value the constructor refuses, e.g. an int of > 4300 digits
        reason = str(exc).split(";")[0]  # Python's advice to raise its limit is not for users
        raise InvalidDocument([Problem("", f"invalid YAML: {reason}")]) from exc
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
