"""What one simulated policy achieved, per phase and over time."""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PhaseStats:
    name: str
    duration_s: float
    num_tokens: int = 0
    num_steps: int = 0
    num_decisions: int = 0
    sum_spec_tokens: int = 0
    num_no_draft: int = 0
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    # Arrival to last token of the requests that arrived in this phase; a request still
    # running when the run ends counts up to the end (a lower bound), ``num_unfinished`` of
    # them.
    latency_s: list[float] = field(default_factory=list)
    num_unfinished: int = 0

    def as_dict(self) -> dict[str, Any]:
        decisions = max(1, self.num_decisions)
        return {
            "duration_s": self.duration_s,
            "goodput_tok_s": self.num_tokens / self.duration_s,
            "num_tokens": self.num_tokens,
            "num_requests_finished": len(self.tpot_s),
            "tpot_ms_mean": _mean_ms(self.tpot_s),
            "tpot_ms_p50": _pct_ms(self.tpot_s, 0.5),
            "ttft_ms_mean": _mean_ms(self.ttft_s),
            "ttft_ms_p95": _pct_ms(self.ttft_s, 0.95),
            "latency_ms_mean": _mean_ms(self.latency_s),
            "num_unfinished": self.num_unfinished,
            "mean_spec_tokens": self.sum_spec_tokens / decisions,
            "share_no_draft": self.num_no_draft / decisions,
            "num_steps": self.num_steps,
        }


def _mean_ms(values: list[float]) -> float | None:
    return statistics.fmean(values) * 1e3 if values else None


def _pct_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


class RunStats:
    """Accumulates a policy's run: per phase figures and binned time series."""

    def __init__(self, phases: list[tuple[str, float]], bin_s: float):
        self.phases = [PhaseStats(name, duration) for name, duration in phases]
        self._starts: list[float] = []
        start = 0.0
        for _, duration in phases:
            self._starts.append(start)
            start += duration
        self.duration_s = start
        self.bin_s = bin_s
        num_bins = max(1, math.ceil(start / bin_s))
        self.bin_tokens = [0] * num_bins
        self.bin_k_sum = [0] * num_bins
        self.bin_decisions = [0] * num_bins

    def phase_index(self, t: float) -> int:
        return max(0, bisect.bisect_right(self._starts, t) - 1)

    def phase_start(self, index: int) -> float:
        return self._starts[index]

    def add_tokens(self, t: float, count: int) -> None:
        if t > self.duration_s:
            return
        self.phases[self.phase_index(t)].num_tokens += count
        self.bin_tokens[self._bin(t)] += count

    def add_step(self, t: float, spec_tokens: list[int]) -> None:
        if t > self.duration_s:
            return
        phase = self.phases[self.phase_index(t)]
        phase.num_steps += 1
        phase.num_decisions += len(spec_tokens)
        total = sum(spec_tokens)
        phase.sum_spec_tokens += total
        phase.num_no_draft += spec_tokens.count(0)
        b = self._bin(t)
        self.bin_k_sum[b] += total
        self.bin_decisions[b] += len(spec_tokens)

    def _bin(self, t: float) -> int:
        return min(len(self.bin_tokens) - 1, int(t / self.bin_s))

    def add_first_token(self, arrival_s: float, ttft_s: float) -> None:
        self.phases[self.phase_index(arrival_s)].ttft_s.append(ttft_s)

    def add_finish(self, t: float, tpot_s: float, arrival_s: float) -> None:
        if t <= self.duration_s:
            self.phases[self.phase_index(t)].tpot_s.append(tpot_s)
            self.phases[self.phase_index(arrival_s)].latency_s.append(t - arrival_s)
        else:  # its last step ended past the run: not counted as finished inside it
            self.add_unfinished(arrival_s)

    def add_unfinished(self, arrival_s: float) -> None:
        """A request still queued or running at the run's end: its latency so far."""
        phase = self.phases[self.phase_index(arrival_s)]
        phase.latency_s.append(self.duration_s - arrival_s)
        phase.num_unfinished += 1

    def as_dict(self) -> dict[str, Any]:
        tokens = sum(p.num_tokens for p in self.phases)
        tpots = [x for p in self.phases for x in p.tpot_s]
        ttfts = [x for p in self.phases for x in p.ttft_s]
        latencies = [x for p in self.phases for x in p.latency_s]
        return {
            "goodput_tok_s": tokens / self.duration_s,
            "num_tokens": tokens,
            "tpot_ms_mean": _mean_ms(tpots),
            "ttft_ms_mean": _mean_ms(ttfts),
            "latency_ms_mean": _mean_ms(latencies),
            "num_unfinished": sum(p.num_unfinished for p in self.phases),
            "phases": {p.name: p.as_dict() for p in self.phases},
            "series": {
                "bin_s": self.bin_s,
                "goodput_tok_s": [n / self.bin_s for n in self.bin_tokens],
                "mean_spec_tokens": [
                    k / d if d else None
                    for k, d in zip(self.bin_k_sum, self.bin_decisions, strict=True)
                ],
            },
        }
