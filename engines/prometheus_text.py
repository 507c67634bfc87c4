"""Prometheus text exposition -> the few series draftctl reads, and the scrape snapshot type.

Engine ``/metrics`` pages are long (vLLM's is ~650 lines of histograms); the gateway only needs
a handful of series, so ``MetricsText.parse`` keeps just the names it is asked for and skips
every other line with one ``startswith`` test. That keeps a scrape off the event loop's
critical path (well under a millisecond), where the general ``prometheus_client`` parser
takes tens of milliseconds on a busy 2-core machine.

Format handled (text exposition 0.0.4): ``name{label="value",...} value [timestamp]``;
``# HELP`` / ``# TYPE`` comments and blank lines are skipped; label values may contain
escaped quotes; a sample's timestamp is ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class MetricsParseError(ValueError):
    """A wanted series has a line that is not valid Prometheus text."""


Labels = dict[str, str]


class MetricsText:
    """The wanted series of one ``/metrics`` page: name -> [(labels, value), ...]."""

    def __init__(self, series: dict[str, list[tuple[Labels, float]]]) -> None:
        self._series = series

    @classmethod
    def parse(cls, text: str, wanted: Iterable[str]) -> MetricsText:
        """Parse ``text`` keeping only series whose name is in ``wanted``.

        Raises MetricsParseError naming the line when a wanted series' line is malformed.
        """
        names = frozenset(wanted)
        prefixes = tuple(names)
        series: dict[str, list[tuple[Labels, float]]] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.startswith(prefixes):
                continue
            name, labels, value = _parse_line(line, number)
            if name in names:
                series.setdefault(name, []).append((labels, value))
        return cls(series)

    def has(self, name: str) -> bool:
        return name in self._series

    def total(self, name: str) -> float | None:
        """Sum over all label sets (e.g. vLLM's per-engine series); None when absent."""
        values = [value for _, value in self._series.get(name, [])]
        return math.fsum(values) if values else None

    def values(self, name: str) -> list[float]:
        return [value for _, value in self._series.get(name, [])]

    def total_by_label(self, name: str, label: str) -> dict[str, float]:
        """Sum per value of ``label`` (other labels summed over); series without it are skipped."""
        totals: dict[str, float] = {}
        for labels, value in self._series.get(name, []):
            key = labels.get(label)
            if key is not None:
                totals[key] = totals.get(key, 0.0) + value
        return totals


def _parse_line(line: str, number: int) -> tuple[str, Labels, float]:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        close = line.rfind("}")
        if close < brace:
            raise MetricsParseError(f"line {number}: unclosed label set in {line!r}")
        labels = _parse_labels(line[brace + 1 : close], number, line)
        rest = line[close + 1 :]
    else:
        name, _, rest = line.partition(" ")
        labels = {}
    fields = rest.split()
    if not fields:
        raise MetricsParseError(f"line {number}: no value in {line!r}")
    try:
        value = float(fields[0])
    except ValueError:
        raise MetricsParseError(f"line {number}: value {fields[0]!r} is not a number") from None
    return name, labels, value


def _parse_labels(body: str, number: int, line: str) -> Labels:
    labels: Labels = {}
    position = 0
    while position < len(body):
        match = _LABEL.match(body, position)
        if match is None:
            if body[position:].strip():
                raise MetricsParseError(f"line {number}: bad label set in {line!r}")
            break
        labels[match.group(1)] = _unescape(match.group(2))
        position = match.end()
    return labels


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


@dataclass(frozen=True)
class ScrapeSample:
    """What one scrape of one server reported, backend-neutral. None: series absent.

    Counters are cumulative since the server started (``CounterWindow`` turns them into
    windowed deltas); ``running`` / ``waiting`` / ``accept_length`` are gauges.
    """

    time_s: float
    running: float | None = None
    waiting: float | None = None
    # vLLM counters: verify steps with drafts, drafted tokens, accepted drafted tokens.
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    # vLLM: accepted count per draft position (index 0 = first drafted token).
    accepted_per_position: tuple[float, ...] = ()
    # SGLang gauge: mean tokens per verify step incl. bonus over the engine's last log interval.
    accept_length: float | None = None
