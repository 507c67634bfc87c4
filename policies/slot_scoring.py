"""A two-phase step's slot scoring, handed to the device so that no host sync sits between the
draft and the verify (issue 16).

A two-phase step drafts every row's block, then verifies per row the k an allocation picks
from the draft's own confidence. Allocated on the host, the step waits for the confidence to
come back (0.46 / 0.67 / 1.18 ms at 1 / 8 / 64 rows on the H200, session 18). vLLM's adaptive
verification does not wait: its budget (how many draft slots the step verifies) comes from the
previous step's confidences, copied to the host asynchronously, and the allocation of that
budget uses the fresh confidences on the GPU. ``SlotScoring`` is that split for any policy
whose per-slot acceptance is a logistic function of the draft's confidence:

    x[r, j] = clamp(logit(c[r, j]), -max_log_odds, max_log_odds)
    b       = bin of x[r, j] among ``edges`` (numpy's searchsorted, side left)
    logit p[r, j] = scale[t_r, b] * base[r, j] + beta[t_r, b] + alpha[t_r, b] * x[r, j]
    survival[r, j] = prod_{i <= j} p[r, i]

(vLLM's logistic: one table entry, ``alpha`` its slope, ``base`` its per-position intercepts;
``policies.slot_allocator``: per task and confidence bin, ``base`` the prior and own-history
log-odds.) The host fixes ``budget`` (its estimate of the draft slots worth verifying, from
what it knew before the draft); the engine rounds the step's tokens up to a captured bucket
and the device then fills every slot it pays for, best survival first (``allocate``).

``allocate`` here is the numpy reference of the device's allocation
(engines/embedded/device_allocation.py computes the same on tensors); pure, no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from policies.baselines.slot_budget import Floats, Ints, allocate_slots, eligible


@dataclass(frozen=True)
class SlotScoring:
    """One step's scoring (shapes above): ``capacities`` [rows] the most each row may
    verify; ``tasks`` [rows] the table row each row reads; ``base`` [rows, K]; ``edges``
    [bins - 1], increasing; ``alpha``, ``beta``, ``scale`` [tables, bins]; ``budget`` the
    host's estimate of the slots worth verifying; rows given 0 < k < ``min_spec_tokens`` are
    raised to it or dropped to 0 (``allocate``)."""

    capacities: Ints
    tasks: Ints
    base: Floats
    edges: Floats
    alpha: Floats
    beta: Floats
    scale: Floats
    max_log_odds: float
    budget: int
    min_spec_tokens: int = 1
    # [rows] the host's own per-row feature (SlotAllocator's x_r) for its learning from
    # the step (``observed``); the device does not read it.
    recency: Floats | None = None

    def __post_init__(self) -> None:
        rows, positions = self.base.shape
        tables = self.alpha.shape
        if self.capacities.shape != (rows,) or self.tasks.shape != (rows,):
            raise ValueError(f"capacities and tasks need shape ({rows},) for {rows} rows")
        if len(tables) != 2 or tables[1] != len(self.edges) + 1:
            raise ValueError(f"alpha {tables} needs [tables, {len(self.edges) + 1}] (edges + 1)")
        if self.beta.shape != tables or self.scale.shape != tables:
            raise ValueError(f"alpha, beta and scale need one shape, got {tables}")
        if rows and (self.tasks.min() < 0 or self.tasks.max() >= tables[0]):
            raise ValueError(f"tasks must index the {tables[0]} table rows")
        if rows and (self.capacities.min() < 0 or self.capacities.max() > positions):
            raise ValueError(f"capacities must be in [0, {positions}]")
        if np.any(np.diff(self.edges) <= 0):
            raise ValueError("edges must increase")
        if not self.max_log_odds > 0 or self.budget < 0 or self.min_spec_tokens < 1:
            raise ValueError("max_log_odds must be > 0, budget >= 0, min_spec_tokens >= 1")

    @property
    def num_positions(self) -> int:
        return int(self.base.shape[1])


def features(confidence: Floats, max_log_odds: float) -> Floats:
    """Clamped log-odds of top-1 draft probabilities in [0, 1] (0 and 1 go to the clamp)."""
    with np.errstate(divide="ignore"):
        odds = np.log(confidence) - np.log1p(-confidence)
    return np.clip(odds, -max_log_odds, max_log_odds)


def survival(scoring: SlotScoring, confidence: Floats) -> Floats:
    """[rows, K] survival of each slot from the draft's confidence [rows, >= K] (positions past
    a row's capacity are scored too and never allocated)."""
    x = features(confidence[:, : scoring.num_positions], scoring.max_log_odds)
    at = scoring.tasks[:, None] * scoring.alpha.shape[1] + np.searchsorted(scoring.edges, x)
    z = scoring.scale.ravel()[at] * scoring.base + scoring.beta.ravel()[at]
    p = 1.0 / (1.0 + np.exp(-(z + scoring.alpha.ravel()[at] * x)))
    result: Floats = np.cumprod(p, axis=1)
    return result


def allocate(scoring: SlotScoring, confidence: Floats, slots: int) -> Ints:
    """k per row when the step verifies at most ``slots`` draft slots (what its token bucket
    pays for beyond each row's own token):

    1. the ``slots`` best eligible slots by survival, equal scores in row-major order (vLLM's
       stable sort key), so each row gets a prefix of its block;
    2. a row given 0 < k < min is raised to ``min(min, capacity)`` when its first slots up to
       there survive on average at least as well as the last slot admitted, else dropped to 0;
    3. if the raises overfill ``slots``, the worst slots past ``min`` of any row are given back
       (a later position before an earlier one at equal survival); if that cannot make room,
       the raised rows whose first slots survive worst drop to 0 first (earlier rows first
       at equal survival), as few as make room, and the rest is given back as before."""
    s = survival(scoring, confidence)
    caps = scoring.capacities
    counts = allocate_slots(s, caps, slots)
    return bound_counts(s, caps, counts, slots, scoring.min_spec_tokens)


def bound_counts(s: Floats, caps: Ints, counts: Ints, slots: int, low: int) -> Ints:
    """Steps 2 and 3 of ``allocate`` on ``counts``, the ``slots`` best eligible slots of
    survival ``s`` [rows, K]: rows given 0 < k < ``low`` raised or dropped, and the step kept
    within ``slots`` (the host allocator's bounds too, so that a raise never pushes a step
    past the token count its budget paid for)."""
    if low <= 1:
        return counts
    mask = eligible(s, caps)
    take = min(max(0, slots), int(mask.sum()))
    marginal = np.sort(s[mask])[::-1][take - 1] if take > 0 else 1.0
    width = np.minimum(low, caps)
    positions = np.arange(s.shape[1])[None, :]
    head = np.where(positions < width[:, None], s, 0.0).sum(axis=1) / np.maximum(width, 1)
    short = (counts > 0) & (counts < low)
    raised = short & (head >= marginal)
    bounded: Ints = np.where(short, np.where(raised, width, 0), counts)
    excess = int(bounded.sum()) - max(0, slots)
    if excess <= 0:
        return bounded
    removable = (positions >= low) & (positions < bounded[:, None])
    short_of = excess - int(removable.sum())
    if short_of > 0:  # drop the raised rows of the worst heads, as few as make room
        order = np.argsort(np.where(raised, head, np.inf), kind="stable")
        freed = np.cumsum(np.where(raised, width, 0)[order])
        dropped = np.zeros(len(order), dtype=np.bool_)
        dropped[order] = (freed - np.where(raised, width, 0)[order]) < short_of
        bounded = np.where(dropped & raised, 0, bounded)
        excess = int(bounded.sum()) - max(0, slots)
        if excess <= 0:
            return bounded
    # Lowest survival first; equal ones latest (row-major) first, so rows keep prefixes.
    flat = np.where(removable, s, np.inf).ravel()[::-1]
    order = np.argsort(flat, kind="stable")[:excess]
    removed = np.zeros(flat.size, dtype=np.bool_)
    removed[flat.size - 1 - order] = True
    trimmed: Ints = bounded - removed.reshape(s.shape).sum(axis=1)
    return trimmed


def scoring_for(
    scoring: SlotScoring, made_for: Mapping[str, int], rows: Sequence[str]
) -> SlotScoring | None:
    """A scoring made ahead (while the previous step ran) for the rows ``made_for`` (row id ->
    its row there), for a step of ``rows``: itself for the same rows in the same order; for
    some of them (a request finished) their rows, the budget scaled by the share of rows
    left; None if a row is new (it has no scoring)."""
    at = [made_for.get(row) for row in rows]
    if any(i is None for i in at):
        return None
    if len(at) == len(made_for) and at == list(range(len(at))):
        return scoring
    index = np.array(at, dtype=np.int64)
    return replace(
        scoring,
        capacities=scoring.capacities[index],
        tasks=scoring.tasks[index],
        base=scoring.base[index],
        budget=round(scoring.budget * len(index) / max(1, len(made_for))),
        recency=None if scoring.recency is None else scoring.recency[index],
    )
