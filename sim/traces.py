"""Acceptance traces: which output tokens the drafter gets wrong, for one request.

A trace line (``traces/*.jsonl``, recorded by the embedded engine verifying the full block,
k = block_size - 1, at every step) reads::

    {"task": "math", "block_size": 16, "prompt_tokens": 312, "accept_lengths": [7, 3, 16, ...]}

Replaying at a smaller k uses the *hard token* model: a step starting at output position p
that accepted n < block_size - 1 drafts failed on token p + n (the target emitted it as the
correction). Any later window that drafts that token fails there again, so a step at
position p verifying k drafts accepts ``min(k, next_hard(p) - p)`` and emits that + 1 (the
bonus). From a recorded step's own start this is ``min(L - 1, k) + 1`` for its accept length
L. Replay follows output positions, not recorded steps: after a run cut short by k the next
step starts inside the recorded run and keeps accepting up to its hard token. Assumption: a
step that accepted the whole block marks no hard token, so its bonus token counts as
draftable. With k = block_size - 1 this replays the recorded steps exactly; the oracle reads
the same structure ahead of time. A line may instead give the hard positions themselves::

    {"task": "chat", "block_size": 16, "prompt_tokens": 90, "output_tokens": 412,
     "hard_positions": [3, 5, 11, ...]}

(what ``draftctl plan --traffic-log`` derives from a daemon's served requests, sim/traffic_log.py).

Without trace files the fallback is a *parametric* model (labelled as such in every report):
per-task conditional acceptance per position, with a per-request logit offset.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from policies.types import Task
from sim.scenario import ParametricTask


@dataclass(frozen=True)
class AcceptanceTrace:
    """Output length and sorted positions of tokens the drafter mispredicts."""

    num_output_tokens: int
    hard_positions: tuple[int, ...]
    # Per-position conditional rates of this request: the ones a parametric trace was drawn
    # from, or a recorded trace's own rates over its whole recording (hindsight).
    true_rates: tuple[float, ...] | None = None

    def accepted_at(self, position: int, spec_tokens: int, hint: int = 0) -> tuple[int, int]:
        """(accepted drafts at ``position`` with k drafts, index hint for the next call)."""
        hard = self.hard_positions
        i = hint
        if i < len(hard) and hard[i] < position:
            i = bisect.bisect_left(hard, position, lo=i)
        gap = hard[i] - position if i < len(hard) else spec_tokens
        return min(spec_tokens, gap), i


def trace_from_accept_lengths(accept_lengths: list[int], block_size: int) -> AcceptanceTrace:
    """Hard positions implied by a full-block run of accept lengths (bonus included)."""
    hard: list[int] = []
    position = 0
    for length in accept_lengths:
        if length < 1 or length > block_size:
            raise ValueError(f"accept length {length} outside [1, {block_size}]")
        if length < block_size:
            hard.append(position + length - 1)
        position += length
    return AcceptanceTrace(position, tuple(hard), recorded_rates(accept_lengths, block_size))


def recorded_rates(accept_lengths: list[int], block_size: int) -> tuple[float, ...]:
    """Conditional acceptance per drafted position over a full-block recording.

    Position i was at risk in the steps that accepted at least i - 1 drafts and succeeded in
    those that accepted at least i; one pseudo-trial at 0.5 keeps unseen positions in (0, 1).
    """
    accepted = [length - 1 for length in accept_lengths]
    rates = []
    for i in range(1, block_size):
        at_risk = sum(1 for a in accepted if a >= i - 1)
        hits = sum(1 for a in accepted if a >= i)
        rates.append((hits + 0.5) / (at_risk + 1.0))
    return tuple(rates)


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def parametric_rates(model: ParametricTask, block_size: int, shift: float = 0.0) -> list[float]:
    """Per-position conditional rates of a request whose logit offset is ``shift`` (0: the
    task's median request)."""
    n = block_size - 1
    rates = []
    for i in range(n):
        base = model.first_rate + (model.last_rate - model.first_rate) * i / max(1, n - 1)
        rates.append(1.0 / (1.0 + math.exp(-(_logit(base) + shift))))
    return rates


def parametric_trace(
    model: ParametricTask, block_size: int, num_output_tokens: int, rng: random.Random
) -> AcceptanceTrace:
    """Sample a full-block run from per-position conditional rates, then convert it."""
    n = block_size - 1
    shift = rng.gauss(0.0, model.request_spread) if model.request_spread > 0 else 0.0
    rates = parametric_rates(model, block_size, shift)
    lengths: list[int] = []
    produced = 0
    while produced < num_output_tokens:
        accepted = 0
        while accepted < n and rng.random() < rates[accepted]:
            accepted += 1
        lengths.append(accepted + 1)
        produced += accepted + 1
    trace = trace_from_accept_lengths(lengths, block_size)
    return AcceptanceTrace(num_output_tokens, trace.hard_positions, tuple(rates))


@dataclass(frozen=True)
class TraceRecord:
    task: Task
    prompt_tokens: int | None  # None: the trace did not record it (drawn from the scenario)
    trace: AcceptanceTrace


def load_traces(path: Path, block_size: int) -> dict[Task, list[TraceRecord]]:
    """Read every ``*.jsonl`` under ``path`` (or the one file); errors name file and line."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    out: dict[Task, list[TraceRecord]] = {}
    for file in files:
        for number, line in enumerate(file.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = _record(json.loads(line), block_size)
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{file}:{number}: bad trace line ({exc})") from exc
            out.setdefault(record.task, []).append(record)
    return out


def _record(data: dict[str, object], block_size: int) -> TraceRecord:
    recorded_block = int(str(data.get("block_size", block_size)))
    if recorded_block != block_size:
        raise ValueError(f"block_size {recorded_block} != scenario block_size {block_size}")
    prompt = data.get("prompt_tokens")
    if "hard_positions" in data:
        trace = _hard_trace(data["hard_positions"], data.get("output_tokens"), block_size)
    else:
        lengths = data["accept_lengths"]
        if not isinstance(lengths, list) or not lengths:
            raise ValueError("accept_lengths must be a non-empty list")
        trace = trace_from_accept_lengths([int(x) for x in lengths], block_size)
    return TraceRecord(
        task=Task(str(data["task"])),
        prompt_tokens=None if prompt is None else int(str(prompt)),
        trace=trace,
    )


def _hard_trace(hard: object, output_tokens: object, block_size: int) -> AcceptanceTrace:
    """A line in the hard-token form (``{"output_tokens": N, "hard_positions": [...]}``, what
    ``draftctl plan --traffic-log`` derives from served requests), with the per-position rates
    of the full-block steps it implies (as a full-block recording's)."""
    if not isinstance(hard, list) or output_tokens is None:
        raise ValueError("hard_positions must be a list, with output_tokens beside it")
    positions = [int(x) for x in hard]
    num_output = int(str(output_tokens))
    if num_output < 1:
        raise ValueError(f"output_tokens must be >= 1, got {num_output}")
    if any(b <= a for a, b in itertools.pairwise(positions)) or (positions and positions[0] < 0):
        raise ValueError("hard_positions must be increasing positions >= 0")
    trace = AcceptanceTrace(num_output, tuple(positions))
    lengths, position, hint = [], 0, 0
    while position < num_output:
        accepted, hint = trace.accepted_at(position, block_size - 1, hint)
        lengths.append(accepted + 1)
        position += accepted + 1
    return AcceptanceTrace(num_output, trace.hard_positions, recorded_rates(lengths, block_size))
