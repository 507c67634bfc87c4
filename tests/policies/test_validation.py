"""Bounded YAML loading: alias bombs, deep nesting and values Python refuses are problems."""

from __future__ import annotations

import time

import pytest

from policies.validation import (
    MAX_YAML_DEPTH,
    MAX_YAML_VALUES,
    InvalidDocument,
    parse_yaml,
)

# 9 levels of 9 aliases: 9**9 (about 387 million) values once expanded, in 300 bytes.
ALIAS_BOMB = "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
    for p, n in zip(["", "a", "b", "c", "d", "e", "f", "g", "h"], "abcdefghi", strict=True)
)


def _problem(text: str) -> str:
    started = time.monotonic()
    with pytest.raises(InvalidDocument) as info:
        parse_yaml(text)
    assert time.monotonic() - started < 2.0
    [problem] = info.value.problems
    return str(problem)


def test_alias_bomb_is_refused_before_it_is_built() -> None:
    assert len(ALIAS_BOMB) < 400
    assert f"over {MAX_YAML_VALUES} values" in _problem(ALIAS_BOMB)


def test_self_referencing_alias_is_refused() -> None:
    assert "nests deeper" in _problem("a: &a [*a]\n")


@pytest.mark.parametrize("depth", [MAX_YAML_DEPTH + 1, 5_000, 100_000])
def test_deep_nesting_is_refused(depth: int) -> None:
    assert f"deeper than {MAX_YAML_DEPTH} levels" in _problem("[" * depth + "]" * depth)


def test_deep_nesting_through_aliases_is_refused() -> None:
    inner = "[" * 40 + "1" + "]" * 40
    text = f"a: &a {inner}\nb: " + "[" * 30 + "*a" + "]" * 30 + "\n"
    assert "nests deeper" in _problem(text)


def test_integer_past_pythons_digit_limit_is_a_problem() -> None:
    message = _problem("x: " + "1" * 5000)
    assert "4300 digits" in message and "set_int_max_str_digits" not in message


def test_moderate_aliases_still_load() -> None:
    data, lines = parse_yaml("base: &base {k: 7, block_size: 16}\npool: *base\n")
    assert data == {"base": {"k": 7, "block_size": 16}, "pool": {"k": 7, "block_size": 16}}
    assert lines[("pool",)] == 2
    nested = "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1)
    assert parse_yaml(f"x: {nested}")[0] is not None
