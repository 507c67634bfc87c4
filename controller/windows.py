"""Time windows over recent samples: keep the last ``window_s`` seconds, nothing else.

The clock is passed in (``now_s``) so windows are tested without sleeping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Window:
    """Samples ``(t_s, value)`` younger than ``window_s``; pruned on every record/read."""

    window_s: float
    max_samples: int = 10_000
    _samples: deque[tuple[float, float]] = field(default_factory=deque)

    def record(self, now_s: float, value: float) -> None:
        self._samples.append((now_s, value))
        if len(self._samples) > self.max_samples:
            self._samples.popleft()
        self._prune(now_s)

    def _prune(self, now_s: float) -> None:
        horizon = now_s - self.window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()

    def values(self, now_s: float) -> list[float]:
        self._prune(now_s)
        return [v for _, v in self._samples]

    def mean(self, now_s: float) -> float | None:
        values = self.values(now_s)
        return sum(values) / len(values) if values else None

    def quantile(self, now_s: float, q: float) -> float | None:
        return quantile(self.values(now_s), q)


@dataclass
class CountWindow:
    """Vectors of counts ``(t_s, counts)`` summed over the last ``window_s`` seconds.

    Used for speculation counters: [drafts, accepted tokens, accepted at position 0, ...].
    The running sum is updated on record and prune, so ``total`` costs O(width).
    """

    window_s: float
    _samples: deque[tuple[float, tuple[int, ...]]] = field(default_factory=deque)
    _sums: list[int] = field(default_factory=list)

    def record(self, now_s: float, counts: Sequence[int]) -> None:
        self._samples.append((now_s, tuple(counts)))
        if len(counts) > len(self._sums):
            self._sums.extend([0] * (len(counts) - len(self._sums)))
        for i, n in enumerate(counts):
            self._sums[i] += n
        self._prune(now_s)

    def _prune(self, now_s: float) -> None:
        horizon = now_s - self.window_s
        while self._samples and self._samples[0][0] < horizon:
            _, counts = self._samples.popleft()
            for i, n in enumerate(counts):
                self._sums[i] -= n
        if not self._samples:
            self._sums.clear()

    def total(self, now_s: float) -> list[int]:
        self._prune(now_s)
        return list(self._sums)


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile (``q`` in [0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]
