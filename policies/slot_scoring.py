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

from policies.baselines.slot_budget import Bools, Floats, Ints, allocate_slots


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


# The prices per slot ``bounded_allocation`` tries (one batched evaluation, host and device
# alike): survival probabilities lie in [0, 1].
PRICES: Floats = np.arange(1, 129, dtype=np.float64) / 128.0


def allocate(scoring: SlotScoring, confidence: Floats, slots: int) -> Ints:
    """k per row when the step verifies at most ``slots`` draft slots (what its token bucket
    pays for beyond each row's own token), ``min_spec_tokens`` 1: the ``slots`` best eligible
    slots by survival, equal scores in row-major order (vLLM's stable sort key), so each row
    gets a prefix of its block; a higher minimum: ``bounded_allocation``."""
    s = survival(scoring, confidence)
    caps = scoring.capacities
    if scoring.min_spec_tokens <= 1:
        return allocate_slots(s, caps, slots)
    return bounded_allocation(s, caps, slots, scoring.min_spec_tokens)


def bounded_allocation(s: Floats, caps: Ints, slots: int, low: int) -> Ints:
    """k per row in {0} U [min(low, cap), cap], at most ``slots`` in all, for the most expected
    accepted drafts sum_r sum_{j < k_r} s[r, j] (s [rows, K] non-increasing along a row). A
    Lagrangian relaxation: each row's best k at a price per slot (its drafts' survival minus
    the price times k; equal values: the smaller k), at the lowest of ``PRICES`` whose picks
    fit; and, from the picks of the next lower price, which overrun, two repairs — drop the
    rows of the least survival per slot first, as few as make room, or the one row that makes
    room at the least loss. Each of the three then gives the slots left over to the rows it
    verifies, best survival first (row-major at equal survival), then opens rows at their
    minimum while what is left allows (``OPENINGS``, the best first); the best of the three
    is kept (the first at equal value). A row is never opened short of the minimum. Within
    3% of the best allocation on small steps (brute force, tests). Raising and dropping rows
    of the budget's best slots, the rule before, left most of a scarce budget idle."""
    return _bounded(s, caps, slots, low, *_priced(s, caps, low))


def bounded_budget(
    s: Floats, caps: Ints, low: int, num_sampling: int, costs: Floats
) -> tuple[Ints, int]:
    """The draft slots a bounded step pays for and their allocation: vLLM's rule
    ``argmax_d (n + V(d)) / cost(d)`` (``slot_budget.draft_budget``) over ``V(d)``, the
    expected accepted drafts of ``d`` slots *under the bound* k in {0} U [min(low, cap), cap],
    not over the unbounded sorted survivals, which promise slots the bound cannot spend
    (rows of one to three good slots). ``V`` is read off ``bounded_allocation``'s own price
    sweep (each price's picks: a point of the bounded value's concave hull; linear between
    them, flat past the last), so the choice costs one sweep; ``costs[d]`` the step time with
    d drafts (len = the eligible slots + 1). Returns (k per row, d) with the allocation of d
    as ``bounded_allocation`` makes it."""
    gains, picks = _priced(s, caps, low)
    totals = picks.sum(axis=1)
    worth = gains[np.arange(s.shape[0])[None, :], picks].sum(axis=1)
    order = np.argsort(totals, kind="stable")
    xs, keep = np.unique(totals[order], return_index=True)
    # at equal totals the most value (prices at one total give the same picks' sums)
    ys = np.maximum.reduceat(worth[order], keep)
    d = np.arange(len(costs), dtype=np.float64)
    value = np.interp(d, np.concatenate(([0.0], xs)), np.concatenate(([0.0], ys)))
    slots = int(np.argmax((num_sampling + value) / costs))
    return _bounded(s, caps, slots, low, gains, picks), slots


def _priced(s: Floats, caps: Ints, low: int) -> tuple[Floats, Ints]:
    """Per row the expected accepted drafts of each k (``gains`` [rows, K + 1]) and each
    price's best k per row (``picks`` [prices, rows]; equal values: the smaller k)."""
    rows, positions = s.shape
    pos = np.arange(positions)
    inside = pos[None, :] < caps[:, None]
    gains = np.concatenate([np.zeros((rows, 1)), np.cumsum(np.where(inside, s, 0.0), axis=1)], 1)
    ks = np.arange(positions + 1)
    least = np.minimum(low, caps)[:, None]
    allowed = (ks[None, :] == 0) | ((ks[None, :] >= least) & (ks[None, :] <= caps[:, None]))
    # The bound masked once ([rows, K + 1]), the prices' charges once ([prices, K + 1]): one
    # pass over [prices, rows, K + 1] for the values, one for the argmax (-inf stays -inf).
    charged = PRICES[:, None] * ks[None, :]
    value = np.where(allowed, gains, -np.inf)[None, :, :] - charged[:, None, :]
    picks: Ints = value.argmax(axis=2)
    return gains, picks


def _bounded(s: Floats, caps: Ints, slots: int, low: int, gains: Floats, picks: Ints) -> Ints:
    """``bounded_allocation`` from its price sweep (``_priced``)."""
    rows, positions = s.shape
    slots = max(0, slots)
    inside = np.arange(positions)[None, :] < caps[:, None]
    first = int(np.argmax(picks.sum(axis=1) <= slots))  # the last price (1.0) picks no row
    over_picks = picks[max(first - 1, 0)]
    over = int(over_picks.sum()) - slots
    held = gains[np.arange(rows), over_picks]
    drafting = over_picks > 0
    # the least survival per slot first, as few rows as make room
    density = np.where(drafting, held / np.maximum(over_picks, 1), np.inf)
    order = np.argsort(density, kind="stable")
    before = np.cumsum(over_picks[order]) - over_picks[order]
    cut = np.zeros(rows, dtype=np.bool_)
    cut[order] = before < over
    sparest = np.where(cut & drafting, 0, over_picks)
    # the one row that makes room at the least loss (else as above)
    covers = drafting & (over_picks >= over)
    one = np.arange(rows) == int(np.argmin(np.where(covers, held, np.inf)))
    cheapest = np.where(one & covers, 0, over_picks) if covers.any() else sparest
    minimum = np.minimum(low, caps)
    done = [
        _opened(gains, minimum, _filled(s, inside, counts.astype(np.int64), slots), slots)
        for counts in (picks[first], sparest, cheapest)
    ]
    values = np.array([gains[np.arange(rows), filled].sum() for filled in done])
    # the first within rounding of the best, as on the device (their sums' orders differ)
    return done[int(np.argmax(values >= values.max() - EQUAL_WITHIN))]


# Rows ``bounded_allocation`` may still open with the slots its fill leaves (one at a time).
OPENINGS = 4
EQUAL_WITHIN = 1e-9  # expected drafts within this are equal (host and device sum in other orders)


def _opened(gains: Floats, minimum: Ints, counts: Ints, slots: int) -> Ints:
    """``counts`` with up to ``OPENINGS`` rows at 0 opened at their minimum while the slots
    left allow, the row of the most expected accepted drafts first (the first at equal)."""
    rows = len(counts)
    out = counts.copy()
    for _ in range(OPENINGS):
        room = slots - int(out.sum())
        fits = (out == 0) & (minimum > 0) & (minimum <= room)
        worth = np.where(fits, gains[np.arange(rows), minimum], -np.inf)
        best = int(np.argmax(worth))
        if fits[best]:
            out[best] = minimum[best]
    return out


def _filled(s: Floats, inside: Bools, counts: Ints, slots: int) -> Ints:
    """``counts`` plus the slots left over (of ``slots``), to the rows already verifying, best
    survival first, row-major at equal survival."""
    rows, positions = s.shape
    room = slots - int(counts.sum())
    more = inside & (np.arange(positions)[None, :] >= counts[:, None]) & (counts[:, None] > 0)
    flat = np.where(more, s, -np.inf).ravel()
    rank = np.empty(flat.size, dtype=np.int64)
    rank[np.argsort(-flat, kind="stable")] = np.arange(flat.size)
    taken = (rank.reshape(rows, positions) < min(room, int(more.sum()))) & more
    filled: Ints = counts + taken.sum(axis=1)
    return filled


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
