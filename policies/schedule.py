"""A per-pool batch-size schedule of k, from learned acceptance and the cost model.

vLLM (0.32 checked: ``SpeculativeConfig.num_speculative_tokens_per_batch_size``) accepts a
list of inclusive ranges ``[[batch_start, batch_end, k], ...]`` starting at batch 1; each k is
capped at the server's ``num_speculative_tokens`` and may be 0. For each batch size B this
module picks the k in {0} U [min_k, pool_k] maximising the task-mix-weighted
``sum_t w_t E_t(k) / T(B, k)`` (one k per step for the whole batch, as vLLM applies it) and
merges equal neighbours into ranges. ``best_shared_k`` is the same choice for one live batch
from each row's own rates (engines that pad every row to one verify width). Pure: rates and
cost arrive as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.acceptance import expected_accept_length
from policies.types import StepCost, Task


@dataclass(frozen=True)
class ScheduleRange:
    batch_start: int
    batch_end: int  # inclusive
    spec_tokens: int

    def as_list(self) -> list[int]:
        return [self.batch_start, self.batch_end, self.spec_tokens]


def best_k_for_batch(
    batch_size: int,
    rates: Mapping[Task, Sequence[float]],
    mix: Mapping[Task, float],
    cost: StepCost,
    min_k: int,
    max_k: int,
) -> int:
    """The k with the most mix-weighted expected tokens per second at ``batch_size``."""
    total = sum(mix.values())
    if total <= 0:
        raise ValueError("the task mix needs a positive share for at least one task")

    def score(k: int) -> float:
        tokens = sum(w * expected_accept_length(rates[t], k) for t, w in mix.items()) / total
        return tokens / cost.step_time_s(batch_size, k)

    best_k, best = 0, score(0)
    for k in range(min_k, max_k + 1):
        value = score(k)
        if value > best:
            best_k, best = k, value
    return best_k


def best_shared_k(
    row_rates: Sequence[Sequence[float]],
    cost: StepCost,
    min_k: int,
    max_k: int,
    min_gain: float = 0.0,
) -> int:
    """One k for every row of a batch: the most expected tokens per second for the batch.

    For engines that run a batch at one verify width and draft for every row once any row
    drafts (the embedded engine pads to the widest row), a row choosing k = 0 saves nothing
    while another row drafts: the real choice is the batch's. ``row_rates`` holds each row's
    own per-position rates (e.g. ``GoodputPolicy.rates_for``); drafting must beat a plain
    step by ``min_gain``.
    """
    batch = len(row_rates)
    if batch == 0:
        return 0

    def tokens(k: int) -> float:
        return sum(expected_accept_length(rates, k) for rates in row_rates)

    plain = batch / cost.step_time_s(batch, 0)
    best_k, best = 0, plain * (1.0 + min_gain)
    for k in range(min_k, max_k + 1):
        value = tokens(k) / cost.step_time_s(batch, k)
        if value > best:
            best_k, best = k, value
    return best_k


def build_schedule(
    rates: Mapping[Task, Sequence[float]],
    mix: Mapping[Task, float],
    cost: StepCost,
    min_k: int,
    pool_k: int,
    max_batch_size: int,
) -> list[ScheduleRange]:
    """Ranges covering batch sizes 1..max_batch_size (vLLM's format, start at 1)."""
    if pool_k < 1:
        raise ValueError(f"pool k must be >= 1 to schedule drafting, got {pool_k}")
    if max_batch_size < 1:
        raise ValueError(f"max batch size must be >= 1, got {max_batch_size}")
    lo = min(min_k, pool_k)
    ranges: list[ScheduleRange] = []
    for batch in range(1, max_batch_size + 1):
        k = best_k_for_batch(batch, rates, mix, cost, lo, pool_k)
        if ranges and ranges[-1].spec_tokens == k:
            last = ranges[-1]
            ranges[-1] = ScheduleRange(last.batch_start, batch, k)
        else:
            ranges.append(ScheduleRange(batch, batch, k))
    return ranges
