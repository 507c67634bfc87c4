"""Scrape snapshots -> statistics over a sliding time window (pure: time comes with the samples).

Engine counters are cumulative since the server started, so the useful number is the
increase over the last ``window_s`` seconds. Like Prometheus' ``increase()``, the increase is
summed over consecutive sample pairs, and a counter that went *down* is taken to have been
reset by a restart (its increase over that pair is its new value). A pair where either
sample lacks a series contributes nothing for that series.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from engines import sglang_stats, vllm_stats
from engines.prometheus_text import MetricsText, ScrapeSample

_WANTED = vllm_stats.WANTED_SERIES + sglang_stats.WANTED_SERIES


def parse_prometheus(text: str, time_s: float = 0.0) -> ScrapeSample:
    """The snapshot in a vLLM or SGLang ``/metrics`` page (all None for neither).

    Raises engines.prometheus_text.MetricsParseError when a series draftctl reads is malformed.
    """
    metrics = MetricsText.parse(text, _WANTED)
    if any(metrics.has(name) for name in vllm_stats.WANTED_SERIES):
        return vllm_stats.vllm_scrape_sample(metrics, time_s)
    return sglang_stats.sglang_scrape_sample(metrics, time_s)


@dataclass(frozen=True)
class WindowStats:
    """Increases over a window (counters) plus the latest gauges. None: never reported."""

    span_s: float
    running: float | None
    waiting: float | None
    num_drafts: float | None
    num_draft_tokens: float | None
    num_accepted_tokens: float | None
    accepted_per_position: tuple[float, ...]
    # Mean of an engine-reported accept-length gauge over the window (SGLang).
    accept_length_gauge: float | None = None

    @property
    def mean_accept_length(self) -> float | None:
        """Tokens per verify step incl. bonus: 1 + accepted / drafts, else the engine's gauge."""
        if self.num_drafts and self.num_accepted_tokens is not None:
            return 1.0 + self.num_accepted_tokens / self.num_drafts
        return self.accept_length_gauge

    @property
    def accept_rate_per_position(self) -> list[float]:
        """P(position p accepted) per verify step, p = 0..k-1; [] when unknown."""
        if not self.num_drafts or not self.accepted_per_position:
            return []
        return [accepted / self.num_drafts for accepted in self.accepted_per_position]

    @property
    def draft_acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (bonus excluded)."""
        if not self.num_draft_tokens or self.num_accepted_tokens is None:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens


class CounterWindow:
    """The samples of one server over the last ``window_s`` seconds."""

    def __init__(self, window_s: float = 60.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._samples: deque[ScrapeSample] = deque()

    def add(self, sample: ScrapeSample) -> None:
        """Append a sample; samples older than the window are dropped, bar one baseline."""
        if self._samples and sample.time_s < self._samples[-1].time_s:
            raise ValueError(
                f"sample at {sample.time_s} is older than the last one ({self._samples[-1].time_s})"
            )
        self._samples.append(sample)
        cutoff = sample.time_s - self.window_s
        # Keep the newest sample at or before the cutoff: the window's starting point.
        while len(self._samples) >= 2 and self._samples[1].time_s <= cutoff:
            self._samples.popleft()

    def stats(self) -> WindowStats | None:
        """Increases over the window; None before the first sample."""
        if not self._samples:
            return None
        samples = list(self._samples)
        latest = samples[-1]
        return WindowStats(
            span_s=latest.time_s - samples[0].time_s,
            running=latest.running,
            waiting=latest.waiting,
            num_drafts=_increase(samples, lambda s: s.num_drafts),
            num_draft_tokens=_increase(samples, lambda s: s.num_draft_tokens),
            num_accepted_tokens=_increase(samples, lambda s: s.num_accepted_tokens),
            accepted_per_position=_increase_per_position(samples),
            accept_length_gauge=_mean(s.accept_length for s in samples),
        )


def combine(parts: Sequence[WindowStats]) -> WindowStats | None:
    """One pool's statistics from its servers' windows: counts and gauges add up."""
    if not parts:
        return None
    width = max(len(part.accepted_per_position) for part in parts)
    per_position = tuple(
        sum(p.accepted_per_position[i] for p in parts if len(p.accepted_per_position) > i)
        for i in range(width)
    )
    return WindowStats(
        span_s=max(part.span_s for part in parts),
        running=_sum(part.running for part in parts),
        waiting=_sum(part.waiting for part in parts),
        num_drafts=_sum(part.num_drafts for part in parts),
        num_draft_tokens=_sum(part.num_draft_tokens for part in parts),
        num_accepted_tokens=_sum(part.num_accepted_tokens for part in parts),
        accepted_per_position=per_position,
        accept_length_gauge=_mean(part.accept_length_gauge for part in parts),
    )


def _delta(previous: float, current: float) -> float:
    # A counter that went down was reset (server restart): it counted `current` since.
    return current - previous if current >= previous else current


def _increase(
    samples: list[ScrapeSample], value: Callable[[ScrapeSample], float | None]
) -> float | None:
    values = [value(sample) for sample in samples]
    if all(v is None for v in values):
        return None
    total = 0.0
    for previous, current in itertools.pairwise(values):
        if previous is not None and current is not None:
            total += _delta(previous, current)
    return total


def _increase_per_position(samples: list[ScrapeSample]) -> tuple[float, ...]:
    width = max(len(sample.accepted_per_position) for sample in samples)
    totals = [0.0] * width
    for previous, current in itertools.pairwise(samples):
        before, after = previous.accepted_per_position, current.accepted_per_position
        if len(before) != len(after):  # series appeared / k changed with a restart
            continue
        for position, (old, new) in enumerate(zip(before, after, strict=True)):
            totals[position] += _delta(old, new)
    return tuple(totals)


def _sum(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
