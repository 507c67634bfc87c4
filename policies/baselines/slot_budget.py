"""vLLM adaptive verification's budget rule, and the two ways a padded batch can use it.

Shapes: ``survival`` is [rows, K], ``survival[r, j]`` the probability that drafted position
j + 1 of row r is accepted (the running product of its per-position acceptance estimates, so
non-increasing along j); ``capacities`` is [rows], the drafts each row may verify (slots at or
past it never count).

vLLM (``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py``, ``_compute_budget`` /
``get_num_tokens`` and ``_assign_draft_token_budget``): sort every eligible slot's survival,
best first; the step verifies the ``d`` best slots with

    d* = argmax_d  (n + sum_{i<d} score_i) / cost(d),   d = 0 .. number of eligible slots,

n the rows that sample this step (every decode row), cost(d) the profiled step time with
d draft tokens on top of the rows' own; the first maximum wins. The d* best slots are then
admitted, ties broken by (row, position) order (the kernel's stable packed sort key), so each
row gets a prefix of its block.

A padded engine cannot verify a different count per row. ``padded_width`` is that objective
over what a padded step can do: width k admits every slot below k of every row (the step pays
for them all), so ``argmax_k (n + sum_r sum_{j < min(k, cap_r)} survival[r, j]) / T(B, k)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


def eligible(survival: Floats, capacities: Ints) -> Bools:
    """[rows, K] mask of slots a row may verify (position < its capacity)."""
    positions = np.arange(survival.shape[1])
    return positions[None, :] < capacities[:, None]


def draft_budget(scores: Floats, num_sampling: int, costs: Floats) -> int:
    """vLLM's d*: ``scores`` sorted best first; ``costs[d]`` = step time with d drafts."""
    if len(costs) != len(scores) + 1:
        raise ValueError(f"costs needs {len(scores) + 1} entries (d = 0..{len(scores)})")
    tokens = num_sampling + np.concatenate(([0.0], np.cumsum(scores)))
    return int(np.argmax(tokens / costs))


def sorted_scores(survival: Floats, capacities: Ints) -> Floats:
    """Every eligible slot's survival, best first."""
    return np.sort(survival[eligible(survival, capacities)])[::-1]


def allocate_slots(survival: Floats, capacities: Ints, budget: int) -> Ints:
    """Admitted drafts per row when the ``budget`` best eligible slots are verified. Equal
    scores are taken in row-major order, as vLLM's stable (score, index) sort key takes them:
    the winners are every slot above the ``budget``-th best score and the first of those
    equal to it (a selection, not a sort: this runs between draft and verify)."""
    rows, positions = survival.shape
    mask = eligible(survival, capacities)
    take = min(max(0, budget), int(mask.sum()))
    if take == 0:
        return np.zeros(rows, dtype=np.int64)
    scores = np.where(mask, survival, -np.inf)
    flat = scores.ravel()
    threshold = np.partition(flat, flat.size - take)[flat.size - take]
    above = scores > threshold
    equal = (scores == threshold).ravel()
    first = equal & (np.cumsum(equal) <= take - int(above.sum()))
    counts: Ints = above.sum(axis=1) + first.reshape(rows, positions).sum(axis=1)
    return counts.astype(np.int64)


def expected_by_width(survival: Floats, capacities: Ints) -> Floats:
    """[K + 1]: expected accepted drafts summed over rows when the step verifies width k."""
    admitted = np.where(eligible(survival, capacities), survival, 0.0).sum(axis=0)
    return np.concatenate(([0.0], np.cumsum(admitted)))


def padded_width(
    drafts_by_width: Floats, num_sampling: int, cost_by_k: Floats, candidates: Sequence[int]
) -> int:
    """The candidate k (0 always allowed) with the most expected tokens per second;
    ``drafts_by_width`` from ``expected_by_width``."""
    best_k, best = 0, num_sampling / cost_by_k[0]
    for k in candidates:
        rate = (num_sampling + drafts_by_width[k]) / cost_by_k[k]
        if rate > best:
            best_k, best = k, rate
    return best_k


def ragged_costs(cost_by_k: Floats, batch_size: int, max_drafts: int) -> Floats:
    """cost(d) for d = 0..max_drafts from padded step times alone: d drafts spread over the
    batch cost what a step of ceil(d / B) drafts per row costs (coarse: a whole width's cost
    from its first draft; ``ragged_cost.TableRaggedCost`` prices the tokens themselves)."""
    k_of_d = -(-np.arange(max_drafts + 1) // max(1, batch_size))
    return cost_by_k[np.minimum(k_of_d, len(cost_by_k) - 1)]
