"""Validation helpers shared by the vLLM and SGLang statistics parsers (pure)."""

from __future__ import annotations


def count(value: object) -> int | None:
    """``value`` as a non-negative int, or None when it is anything else (bools included)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def counts(value: object) -> list[int] | None:
    """A list of non-negative ints, or None when ``value`` is not exactly that."""
    if not isinstance(value, list):
        return None
    checked = [count(item) for item in value]
    return None if any(item is None for item in checked) else [c for c in checked if c is not None]


def accepted_per_position(histogram: list[int]) -> list[int]:
    """Accepted count per draft position from a histogram of drafts accepted per step.

    ``histogram[j]`` = verify steps that accepted exactly j drafts. A step that accepts j
    drafts accepts positions 0..j-1 (acceptance is a prefix), so position p was accepted by
    every step with j > p. Length: len(histogram) - 1 = k.
    """
    return [sum(histogram[position + 1 :]) for position in range(len(histogram) - 1)]
