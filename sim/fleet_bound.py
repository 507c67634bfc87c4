"""The most homogeneous batches can buy at one batch size, from the schedules' own inputs.

At batch size B a mixed batch runs one k for every row (``best_k_for_batch`` on the traffic
mix); a homogeneous batch of each task runs that task's own best k at the same B. The ratio of
their mix-weighted expected tokens per second bounds what sorting requests into task pools
gains on engines that verify a batch at one width, before any load imbalance: expected
acceptance (``E(k)`` from per-position rates) and the step cost model, no simulation.
"""

from __future__ import annotations

from typing import Any

from policies.acceptance import expected_accept_length
from policies.schedule import best_k_for_batch
from policies.types import max_spec_tokens
from sim.fleet_build import FitInputs

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def homogeneous_bound(fit: FitInputs) -> dict[str, Any]:
    """Per batch size: each task's own k, the mixed batch's k, and the gain of separating."""
    top = max_spec_tokens(fit.block_size)
    total = sum(fit.mix.values())
    out: dict[str, Any] = {}
    for batch in BATCH_SIZES:
        own = {
            t: best_k_for_batch(batch, fit.rates, {t: 1.0}, fit.cost, fit.min_spec_tokens, top)
            for t in fit.mix
        }
        shared = best_k_for_batch(batch, fit.rates, fit.mix, fit.cost, fit.min_spec_tokens, top)

        def rate(task: Any, k: int, b: int = batch) -> float:
            return expected_accept_length(fit.rates[task], k) / fit.cost.step_time_s(b, k)

        apart = sum(w * rate(t, own[t]) for t, w in fit.mix.items()) / total
        mixed = sum(w * rate(t, shared) for t, w in fit.mix.items()) / total
        out[str(batch)] = {
            "k_by_task": {t.value: k for t, k in own.items()},
            "k_mixed": shared,
            "gain": apart / mixed,
        }
    return out
