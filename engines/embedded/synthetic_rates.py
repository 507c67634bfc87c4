"""Acceptance profiles as rates: conversions between vLLM's forms and mean accept lengths, and
``TaskProfile``, one task's curve plus its logit-space spreads (pure numpy; docs/synthetic.md).

Conditional rate c_i = P(drafted position i accepted | positions 1..i-1 accepted); unconditional
p_i = P(positions 1..i all accepted) = c_1 ... c_i (vLLM's ``synthetic_acceptance_rates``); accept
length = accepted drafts + 1 (the bonus token).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import numpy as np

MAX_DRIFT_CORR = 0.98
_DRIFT_TAIL = 0.01  # the AR(1) sum keeps the lags whose weight rho**lag is at least this


def conditional_from_unconditional(rates: Sequence[float]) -> list[float]:
    """vLLM's ``unconditional_to_conditional_rates``: p_i = P(drafts 1..i all accepted) ->
    c_i = p_i / p_(i-1), 0 once a p is 0 (the chain has ended)."""
    return [p / q if q > 0.0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]], strict=True)]


def min_variance_rates(length: float, num_positions: int) -> list[float]:
    """vLLM's ``_acceptance_length_to_rates``: a mean accept length (bonus included) as
    *unconditional* rates [1, ..., 1, frac, 0, ...]; every step accepts floor or ceil."""
    if not 1.0 <= length <= num_positions + 1:
        raise ValueError(f"accept length {length}: must be in [1, {num_positions + 1}]")
    drafts = length - 1.0
    full = int(drafts)
    return ([1.0] * full + [drafts - full] + [0.0] * num_positions)[:num_positions]


def expected_accept_length(conditional_rates: Sequence[float], spec_tokens: int) -> float:
    """E[accept length] drafting k: 1 + sum_{j<=k} prod_{i<=j} c_i (bonus included)."""
    return 1.0 + float(np.cumprod(conditional_rates[:spec_tokens]).sum())


def _logits(rates: Sequence[float] | np.ndarray) -> np.ndarray:
    """logit(c); rates of exactly 0 and 1 become -inf and +inf and stay 0 and 1 under offsets."""
    with np.errstate(divide="ignore"):
        p = np.asarray(rates, dtype=np.float64)
        return np.log(p) - np.log1p(-p)


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(48)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()


def population_accept_length(base_logits: np.ndarray, spec_tokens: int, offset_std: float) -> float:
    """E[accept length] drafting k when every logit moves by x ~ N(0, offset_std) (quadrature)."""
    shifted = sigmoid(base_logits[None, :spec_tokens] + offset_std * _NODES[:, None])
    return 1.0 + float(_WEIGHTS @ np.cumprod(shifted, axis=1).sum(axis=1))


def rates_from_accept_length(
    length: float, num_positions: int, *, decay: float = 0.0, offset_std: float = 0.0
) -> list[float]:
    """Conditional rates c_i = sigmoid(a - decay * (i-1)/(n-1)) whose mean accept length at
    k = n, over logit offsets ~ N(0, offset_std), is ``length``; ``a`` by bisection.

    ``decay`` 0 is llama.cpp's conversion (one constant c with c + ... + c^n = length - 1)."""
    if not 1.0 < length < num_positions + 1:
        raise ValueError(f"accept length {length}: must be in (1, {num_positions + 1})")
    slope = decay * np.arange(num_positions) / max(1, num_positions - 1)
    low, high = -30.0, 30.0
    for _ in range(100):
        level = (low + high) / 2
        mean = population_accept_length(level - slope, num_positions, offset_std)
        low, high = (level, high) if mean < length else (low, level)
    return sigmoid((low + high) / 2 - slope).tolist()


# -- profiles ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskProfile:
    """One task: base conditional rates per drafted position (1..n) and how requests and steps
    scatter around them in logit space."""

    conditional_rates: tuple[float, ...]
    request_spread: float = 0.0  # std of the per-request logit offset
    drift_spread: float = 0.0  # stationary std of the per-step logit drift
    drift_corr: float = 0.0  # lag-1 correlation of the drift, per step

    def __post_init__(self) -> None:
        rates = self.conditional_rates
        if not rates or not all(0.0 <= c <= 1.0 for c in rates):
            raise ValueError(f"conditional_rates={list(rates)}: need at least one, each in [0, 1]")
        if self.request_spread < 0 or self.drift_spread < 0:
            raise ValueError(
                f"request_spread={self.request_spread}, drift_spread={self.drift_spread}: "
                "must be >= 0"
            )
        if not 0.0 <= self.drift_corr <= MAX_DRIFT_CORR:
            raise ValueError(f"drift_corr={self.drift_corr}: must be in [0, {MAX_DRIFT_CORR}]")

    @classmethod
    def from_accept_length(
        cls,
        length: float,
        num_positions: int,
        *,
        decay: float = 0.0,
        request_spread: float = 0.0,
        drift_spread: float = 0.0,
        drift_corr: float = 0.0,
    ) -> TaskProfile:
        """Rates whose *population* mean accept length at k = n (offsets included) is
        ``length`` (see ``rates_from_accept_length``)."""
        offset_std = math.hypot(request_spread, drift_spread)
        rates = rates_from_accept_length(length, num_positions, decay=decay, offset_std=offset_std)
        return cls(tuple(rates), request_spread, drift_spread, drift_corr)

    @classmethod
    def from_unconditional_rates(
        cls,
        rates: Sequence[float],
        *,
        request_spread: float = 0.0,
        drift_spread: float = 0.0,
        drift_corr: float = 0.0,
    ) -> TaskProfile:
        """vLLM's ``synthetic_acceptance_rates`` (P(first i+1 drafts accepted), non-increasing)."""
        if any(b > a for a, b in pairwise(rates)):
            raise ValueError(f"unconditional rates {list(rates)}: must be non-increasing")
        conditional = tuple(conditional_from_unconditional(rates))
        return cls(conditional, request_spread, drift_spread, drift_corr)

    @property
    def num_positions(self) -> int:
        return len(self.conditional_rates)

    @cached_property
    def base_logits(self) -> np.ndarray:
        return _logits(self.conditional_rates)

    @cached_property
    def drift_weights(self) -> np.ndarray:
        """AR(1) as its moving average: drift_t = sum_m w_m z_(t-m), z iid N(0, 1), truncated
        where rho**m < 1 %, scaled so drift_t ~ N(0, drift_spread) exactly."""
        rho = self.drift_corr
        lags = 1 if rho == 0 else math.ceil(math.log(_DRIFT_TAIL) / math.log(rho))
        powers = rho ** np.arange(lags)
        return self.drift_spread * powers / math.sqrt(float((powers**2).sum()))

    def expected_accept_length(self, spec_tokens: int) -> float:
        """Mean accept length per step drafting k, over requests and steps (bonus included)."""
        offset_std = math.hypot(self.request_spread, self.drift_spread)
        return population_accept_length(self.base_logits, spec_tokens, offset_std)
