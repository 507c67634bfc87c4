"""Online per-task, per-position acceptance estimates with priors and censoring.

Model: ``a[i]`` is the *conditional* probability that drafted position ``i + 1`` is accepted
given that positions ``1..i`` were. Under this form censoring is simple and exact:

- a step that drafted k tokens and accepted n (accept length n + 1, bonus included) is a
  success at positions 1..n and, if n < k, a failure at position n + 1;
- positions beyond n + 1 were never at risk and positions beyond k were never drafted: they
  contribute no trial at all (they are censored, not failures).

Each position keeps decayed counts (successes, trials) and a Beta prior of ``prior_strength``
pseudo-trials at the configured prior rate, so the estimate is
``(s + strength * prior) / (t + strength)``. Decay (``half_life_steps``) lets the estimate
follow a shifting workload and lets counts at rarely observed positions shrink, which is what
makes the goodput policy probe them again. Everything here is plain data, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Renormalise lazily-decayed counts once the running scale gets this large.
_RESCALE_AT = 1e12


def expected_accept_length(rates: Sequence[float], spec_tokens: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j: expected tokens gained by a step verifying k."""
    total, survive = 1.0, 1.0
    for rate in rates[:spec_tokens]:
        survive *= rate
        total += survive
    return total


def expected_by_k(rates: Sequence[float]) -> list[float]:
    """E(k) for k = 0..len(rates) in one pass (``expected_accept_length`` for every k)."""
    out, total, survive = [1.0], 1.0, 1.0
    for rate in rates:
        survive *= rate
        total += survive
        out.append(total)
    return out


def drafted_steps(rates: Sequence[float], trials: Sequence[float], start: int, end: int) -> float:
    """Estimated (decayed) steps that drafted positions ``start + 1 .. end``, from their trials.

    A position is a trial only in a step that drafted it *and* accepted every position before
    it, so ``trials[j] ~ drafted x reach[j]`` with ``reach[j] = prod_{i<j} rates[i]``. A step
    that drafts a captured width drafts all of its positions, so pooling them,
    ``sum(trials) / sum(reach)`` estimates how many steps drafted that width. Far positions of
    a hard task have few trials however often they are drafted (their reach is small); this
    count does not shrink with them. Infinite when those positions cannot be reached at all.
    """
    reach = 1.0
    for rate in rates[:start]:
        reach *= rate
    reach_sum, trial_sum = 0.0, 0.0
    for j in range(start, min(end, len(rates))):
        reach_sum += reach
        trial_sum += trials[j] if j < len(trials) else 0.0
        reach *= rates[j]
    return trial_sum / reach_sum if reach_sum > 1e-12 else math.inf


_VECTOR_STEPS = 128  # ``add_steps`` counts with numpy from this many steps


def _step_ends(
    spec_tokens: Sequence[int], accept_lengths: Sequence[int], positions: int
) -> tuple[list[int], list[int], int]:
    """(steps that accepted exactly a drafts, of those the ones rejected at a + 1, steps that
    drafted) for a = 0..positions: ``PositionCounts.add_steps``' counts, vectorised."""
    ks = np.asarray(spec_tokens, dtype=np.intp)
    lengths = np.asarray(accept_lengths, dtype=np.intp)
    drafted = ks > 0
    ks = np.minimum(ks[drafted], positions)
    accepted = np.minimum(np.maximum(lengths[drafted] - 1, 0), ks)
    ends = np.bincount(accepted, minlength=positions + 1)
    failed = np.bincount(accepted[accepted < ks], minlength=positions + 1)
    return ends.tolist(), failed.tolist(), int(ks.size)


def trials_from_step(spec_tokens: int, accept_length: int) -> tuple[int, bool]:
    """(positions accepted, whether position n+1 was rejected) for one verify step."""
    accepted = max(0, min(accept_length - 1, spec_tokens))
    return accepted, accepted < spec_tokens


@dataclass(frozen=True)
class AcceptanceSnapshot:
    """Conditional per-position rates and effective trials per position (for probing)."""

    rates: tuple[float, ...]
    trials: tuple[float, ...]


class PositionCounts:
    """Decayed successes/trials per draft position, with a per-position Beta prior."""

    def __init__(
        self,
        prior: Sequence[float],
        prior_strength: float,
        half_life_steps: float,
        plain_step_age: float = 0.0,
    ):
        """``plain_step_age``: how far a step that drafted nothing ages the counts, as a share
        of a drafted step (``add_step``; 0: not at all)."""
        if not prior:
            raise ValueError("prior needs at least one position")
        self._prior = tuple(prior)
        self._strength = prior_strength
        self._pseudo_successes = [prior_strength * p for p in prior]
        # Lazy decay: stored counts are divided by _scale; each step multiplies _scale by 1/g.
        self._growth = 0.5 ** (-1.0 / half_life_steps) if half_life_steps > 0 else 1.0
        self._plain_age = plain_step_age
        self._scale = 1.0
        self._successes = [0.0] * len(prior)
        self._trials = [0.0] * len(prior)
        self._snapshot: AcceptanceSnapshot | None = None

    @property
    def num_positions(self) -> int:
        return len(self._prior)

    def _tick(self, steps: float = 1) -> None:
        self._scale *= self._growth if steps == 1 else self._growth**steps
        if self._scale > _RESCALE_AT:
            self._successes = [s / self._scale for s in self._successes]
            self._trials = [t / self._scale for t in self._trials]
            self._scale = 1.0
        self._snapshot = None

    def add_step(self, spec_tokens: int, accept_length: int) -> None:
        """Record one verify step that drafted ``spec_tokens`` and gained ``accept_length``.

        A plain step (``spec_tokens`` 0) observes no position but ages every count as
        ``plain_step_age`` of a drafted step. Without that a task whose estimate fell below
        break-even kept it for good: its steps stopped drafting, nothing decayed the counts,
        and the probes, which wait until fewer than ``probe_min_steps`` recent steps drafted
        a width, never came (session 36: the real pair's math turned drafting off on its
        first requests, which accepted 2.06 tokens a step at k = 15, and stayed off through
        two more runs where static k = 15 drew 2.59 and beat plain decoding by 14%). Aged,
        the evidence fades and the probes resume."""
        if spec_tokens <= 0:
            if self._plain_age > 0:
                self._tick(self._plain_age)
            return
        self._tick()
        accepted, rejected = trials_from_step(min(spec_tokens, self.num_positions), accept_length)
        w = self._scale
        for i in range(accepted):
            self._successes[i] += w
            self._trials[i] += w
        if rejected and accepted < self.num_positions:
            self._trials[accepted] += w

    def add_steps(self, spec_tokens: Sequence[int], accept_lengths: Sequence[int]) -> None:
        """``add_step`` for many steps at once (the rows of one engine step, or the steps
        between two spaced decisions): the same counts in O(rows + positions), every step
        weighted as the last of them. Plain Python for a few dozen steps (faster there than
        numpy); from ``_VECTOR_STEPS`` steps (a 64-row batch's steps between two spaced
        decisions: ~500) two ``bincount`` calls, the same integer counts."""
        n = self.num_positions
        if len(spec_tokens) != len(accept_lengths):
            raise ValueError(
                f"{len(spec_tokens)} spec_tokens for {len(accept_lengths)} accept_lengths"
            )
        if len(spec_tokens) >= _VECTOR_STEPS:
            ends, failed, count = _step_ends(spec_tokens, accept_lengths, n)
        else:
            ends = [0] * (n + 1)  # ends[a]: steps that accepted exactly a drafts
            failed = [0] * (n + 1)  # failed[a]: of those, the ones rejected at position a + 1
            count = 0
            for k, length in zip(spec_tokens, accept_lengths, strict=True):
                if k <= 0:
                    continue
                if k > n:
                    k = n
                accepted = min(max(length - 1, 0), k)
                ends[accepted] += 1
                if accepted < k:
                    failed[accepted] += 1
                count += 1
        plain = len(spec_tokens) - count  # they age the counts too (``add_step``)
        if count or (plain and self._plain_age > 0):
            self._tick(count + self._plain_age * plain)
        if not count:
            return
        w = self._scale
        reached = 0  # steps that accepted more than i drafts: a success at position i + 1
        for i in range(n - 1, -1, -1):
            reached += ends[i + 1]
            if reached or failed[i]:
                self._successes[i] += w * float(reached)
                self._trials[i] += w * float(reached + failed[i])

    def add_position_counts(self, num_drafts: int, accepted_per_position: Sequence[int]) -> None:
        """Record aggregate counts (vLLM style): drafts made, and accepts at each position.

        Position i was at risk in every draft that accepted position i-1 (all drafts for
        position 1), so trials[i] = accepted[i-1]; positions past the list were not drafted.
        """
        if num_drafts <= 0 or not accepted_per_position:
            return
        self._tick()
        w = self._scale
        at_risk = float(num_drafts)
        for i, accepted in enumerate(accepted_per_position[: self.num_positions]):
            hits = min(float(accepted), at_risk)
            self._successes[i] += w * hits
            self._trials[i] += w * at_risk
            at_risk = hits

    def snapshot(self) -> AcceptanceSnapshot:
        if self._snapshot is None:  # rebuilt after every recorded step: on the decision path
            inv, k = 1.0 / self._scale, self._strength
            trials = [t * inv for t in self._trials]
            rates = [
                (s * inv + pseudo) / (t + k)
                for s, t, pseudo in zip(
                    self._successes, trials, self._pseudo_successes, strict=True
                )
            ]
            self._snapshot = AcceptanceSnapshot(tuple(rates), tuple(trials))
        return self._snapshot


def request_window(
    spec_tokens: Sequence[int], accept_lengths: Sequence[int], size: int, plain_per_entry: int = 1
) -> tuple[list[int], list[int]]:
    """The steps of a request's window, oldest first, as (k, accept length) lists: its last
    ``size`` entries, where each drafted step is an entry and every ``plain_per_entry``
    consecutive k = 0 steps are one (an entry that adds nothing and pushes the oldest out).

    With 1 the window is the last ``size`` steps. Larger, what a request's drafted steps
    showed outlasts a plain stretch ``plain_per_entry`` times longer: on the real pair
    (H100, call s42c) math requests that accepted ~1.9 at batch 1, under a task estimate
    learnt at 2.7 from other phases' math, went plain once their window showed it and drafted
    again as soon as 32 plain steps had pushed that out: 16% of the math phase's steps drafted
    at a loss (0.88x no speculation there). Reads back from the newest step until the window
    is full, so a long history costs only what the window holds.
    """
    steps = min(len(spec_tokens), len(accept_lengths))
    ks: list[int] = []
    lengths: list[int] = []
    idle = 0
    for index in range(steps - 1, -1, -1):
        if len(ks) >= size:
            break
        k = spec_tokens[index]
        if k > 0:
            idle = 0
            ks.append(k)
            lengths.append(accept_lengths[index])
            continue
        idle += 1
        if idle == plain_per_entry:
            idle = 0
            ks.append(0)
            lengths.append(1)
    ks.reverse()
    lengths.reverse()
    return ks, lengths


def blend_request_history(
    task_rates: Sequence[float],
    spec_tokens_used: Sequence[int],
    accept_lengths: Sequence[int],
    strength: float,
    half_life_steps: float = 0.0,
) -> list[float]:
    """Blend task rates with one request's own recent steps (same censoring rules).

    The task rate acts as a prior of ``strength`` pseudo-trials per position, so a request
    with few observations keeps the task estimate and one with many follows its own data.
    With ``half_life_steps`` > 0 a step's weight halves every that many steps of age (the
    last step has weight 1; steps with k = 0 age the others but add nothing): text comes in
    runs of easy and hard stretches, so the latest steps predict the next one best.
    """
    n = len(task_rates)
    # reached[a]: weight of steps that accepted exactly a drafts; failed[a]: of those, the
    # ones rejected at a + 1.
    reached = [0.0] * (n + 1)
    failed = [0.0] * (n + 1)
    steps = min(len(spec_tokens_used), len(accept_lengths))
    decay = 0.5 ** (1.0 / half_life_steps) if half_life_steps > 0 else 1.0
    weight = 1.0
    for index in range(steps - 1, -1, -1):  # newest first
        k = spec_tokens_used[index]
        if k > 0:
            k = k if k < n else n
            length = accept_lengths[index]
            accepted = length - 1 if length - 1 < k else k
            reached[accepted] += weight
            if accepted < k:
                failed[accepted] += weight
        weight *= decay
    out = [0.0] * n
    beyond = 0.0  # weight of steps that accepted more than i drafts (successes at i + 1)
    for i in range(n - 1, -1, -1):
        beyond += reached[i + 1]
        out[i] = (beyond + strength * task_rates[i]) / (beyond + failed[i] + strength)
    return out
