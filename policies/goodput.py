"""The goodput policy: choose k maximising expected accepted tokens per second.

For one request at batch size B the score of k is ``E(k) / T(B, k)`` with

- ``E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j`` (accept length, bonus included), where ``a_j`` is
  the conditional acceptance of drafted position j: the task estimate from the observation
  (or the configured prior) blended with the request's own recent steps;
- ``T(B, k)`` the step cost at verify width k + 1, padded to the engine's captured widths.

k = 0 (a plain step, score ``1 / T(B, 0)``) wins unless some k beats it by ``min_gain``.
Hysteresis keeps the previous k unless the best is better by ``hysteresis``; during the first
``warmup_steps`` of a request the admission k is kept. Censoring: positions past the chosen k
are never observed, so with probability ``probe_probability`` (using the caller's ``rng_u``)
the policy verifies one captured width wider while fewer than ``probe_min_steps`` of the task's
recent steps drafted those positions (``acceptance.drafted_steps``: counting trials instead
never stops, since far positions have few trials however often they are drafted).

For pool fleets (``observation.pools``) it ranks healthy pools by the request's expected
tokens per second on each (its k, its load and observed TPOT) and returns ``Decision.pool``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.acceptance import (
    blend_request_history,
    drafted_steps,
    expected_accept_length,
    expected_by_k,
    request_window,
)
from policies.costmodel import RelativeCost, padded_width
from policies.model import GoodputSpec
from policies.types import Decision, Observation, PoolView, StepCost


@dataclass(frozen=True)
class Choice:
    spec_tokens: int
    score: float  # expected tokens per second for this request
    expected_tokens: float
    step_time_s: float


class GoodputPolicy:
    """Pure: every input arrives in the observation (rates, cost snapshot, rng_u)."""

    name = "goodput"

    def __init__(self, spec: GoodputSpec):
        self._spec = spec
        self._fallback_cost = RelativeCost(spec.verify_width_multiple)

    def decide(self, observation: Observation) -> Decision:
        rates = self._rates(observation)
        if observation.pools:
            return self._choose_pool(observation, rates)
        cost = observation.step_cost or self._fallback_cost
        batch = max(1, observation.concurrency)
        best, plain, kept, drafting = self._best_k(observation, rates, cost, batch)
        chosen, why = best, "best"
        if kept is not None:
            chosen, why = kept, "hold"
        if chosen.spec_tokens == 0 and self._worth_trying(observation, drafting, plain):
            chosen, why = drafting, "try"
        probe = self._probe_target(observation, chosen.spec_tokens)
        if probe is not None:
            chosen, why = _score(rates, cost, batch, probe), "probe"
        return Decision(
            spec_tokens=chosen.spec_tokens, reason=_reason(observation, chosen, plain, why)
        )

    def rates_for(self, observation: Observation) -> list[float]:
        """The blended per-position rates this policy uses (exposed for tools and tests)."""
        return self._rates(observation)

    def _task_rates(self, observation: Observation) -> list[float]:
        n = max(1, observation.block_size - 1)
        task_rates = list(observation.accept_rates[:n])
        if len(task_rates) < n:
            prior = self._spec.prior_for(observation.task, n)
            task_rates += prior[len(task_rates) :]
        return task_rates

    def _rates(self, observation: Observation) -> list[float]:
        task_rates = self._task_rates(observation)
        if observation.step_index < self._spec.warmup_steps or not observation.request_spec_tokens:
            return task_rates
        spec = self._spec
        ks, lengths = request_window(
            observation.request_spec_tokens,
            observation.request_accept_lengths,
            spec.request_window_steps,
            spec.request_plain_entry_steps,
        )
        return blend_request_history(
            task_rates, ks, lengths, spec.request_prior_strength, spec.request_half_life_steps
        )

    def _best_k(
        self, observation: Observation, rates: Sequence[float], cost: StepCost, batch: int
    ) -> tuple[Choice, Choice, Choice | None, Choice]:
        """(best, plain step, previous k if hysteresis or warm-up keeps it, best k > 0)."""
        expected = expected_by_k(rates)
        plain = _choice(expected, cost, batch, 0)
        draft_k, draft_score = 0, 0.0
        for k in range(observation.min_spec_tokens, observation.max_spec_tokens + 1):
            score = expected[min(k, len(expected) - 1)] / cost.step_time_s(batch, k)
            if score > draft_score:
                draft_k, draft_score = k, score
        drafting = _choice(expected, cost, batch, draft_k)
        wins = draft_k and draft_score > plain.score * (1.0 + self._spec.min_gain)
        best = drafting if wins else plain
        previous = observation.previous_spec_tokens
        if previous is None or not _valid(previous, observation):
            return best, plain, None, drafting
        held = _choice(expected, cost, batch, previous)
        in_warmup = observation.step_index < self._spec.warmup_steps
        if in_warmup or held.score * (1.0 + self._spec.hysteresis) >= best.score:
            return best, plain, held, drafting
        return best, plain, None, drafting

    def _worth_trying(self, observation: Observation, drafting: Choice, plain: Choice) -> bool:
        """Request-level censoring: a request that does not draft cannot show it got easy.

        Draft anyway, when drafting's score is within ``request_probe_margin`` of a plain
        step, while the request has fewer than ``request_probe_steps`` drafted steps of its
        own, or when its last ``request_reprobe_steps`` steps all had k = 0.
        """
        spec = self._spec
        if drafting.spec_tokens == 0:
            return False
        if drafting.score < plain.score * (1.0 - spec.request_probe_margin):
            return False
        history = observation.request_spec_tokens
        if sum(1 for k in history if k > 0) < spec.request_probe_steps:
            return True
        idle = spec.request_reprobe_steps
        return idle > 0 and len(history) >= idle and not any(history[-idle:])

    def _probe_target(self, observation: Observation, spec_tokens: int) -> int | None:
        """One captured width wider than ``spec_tokens``, if a probe is due and useful."""
        spec = self._spec
        if observation.rng_u >= spec.probe_probability or observation.pools:
            return None
        if spec_tokens >= observation.max_spec_tokens:
            return None
        multiple = spec.verify_width_multiple
        wider = observation.min_spec_tokens if spec_tokens == 0 else spec_tokens + multiple
        # The largest k sharing the padded width costs the same and observes more positions.
        target = min(observation.max_spec_tokens, padded_width(wider, multiple) - 1)
        if target <= spec_tokens:
            return None
        rates = self._task_rates(observation)
        seen = drafted_steps(rates, observation.accept_trials, spec_tokens, target)
        return target if seen < spec.probe_min_steps else None

    def _choose_pool(self, observation: Observation, rates: Sequence[float]) -> Decision:
        cost = observation.step_cost or self._fallback_cost
        ranked = sorted(
            (
                (_pool_rate(pool, rates, cost), pool)
                for pool in observation.pools
                if pool.is_healthy
            ),
            key=lambda item: item[0],
            reverse=True,
        )
        if not ranked:
            return Decision(spec_tokens=0, reason="goodput: no healthy pool")
        rate, pool = ranked[0]
        runners = ", ".join(f"{p.name}={r:.1f}" for r, p in ranked[1:3])
        reason = (
            f"goodput: task={observation.task.value} pool {pool.name} (k={pool.spec_tokens}, "
            f"inflight={pool.num_inflight}) expects {rate:.1f} tok/s"
            + (f"; next: {runners}" if runners else "")
        )
        return Decision(spec_tokens=pool.spec_tokens, reason=reason, pool=pool.name)


def _valid(k: int, observation: Observation) -> bool:
    return k == 0 or observation.min_spec_tokens <= k <= observation.max_spec_tokens


def _choice(expected: Sequence[float], cost: StepCost, batch: int, spec_tokens: int) -> Choice:
    k = min(spec_tokens, len(expected) - 1)
    step_s = cost.step_time_s(batch, spec_tokens)
    return Choice(spec_tokens, expected[k] / step_s, expected[k], step_s)


def _score(rates: Sequence[float], cost: StepCost, batch: int, spec_tokens: int) -> Choice:
    return _choice(expected_by_k(rates), cost, batch, spec_tokens)


def _pool_rate(pool: PoolView, rates: Sequence[float], cost: StepCost) -> float:
    """Expected tokens/s for one more request on ``pool``, at its load after admission."""
    k = min(pool.spec_tokens, pool.block_size - 1)
    expected = expected_accept_length(rates, k)
    load = pool.num_inflight + 1
    step_s = cost.step_time_s(load, k)
    if pool.tpot_s is not None and pool.num_inflight > 0:
        # Observed step time = TPOT x tokens per step; scale to the load after admission.
        tokens_per_step = pool.accept_length or expected_accept_length(rates, k)
        observed_step_s = pool.tpot_s * tokens_per_step
        step_s = observed_step_s * step_s / cost.step_time_s(pool.num_inflight, k)
    return expected / step_s


def _reason(observation: Observation, chosen: Choice, plain: Choice, why: str) -> str:
    gain = chosen.score / plain.score if plain.score > 0 else 1.0
    return (
        f"goodput[{why}]: task={observation.task.value} B={observation.concurrency} "
        f"k={chosen.spec_tokens} E={chosen.expected_tokens:.2f} "
        f"T={chosen.step_time_s * 1e3:.2f}ms {gain:.2f}x plain"
    )
