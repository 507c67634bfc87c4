"""How much faster speculation made a task, and how that number was obtained.

Method ``step-times`` (embedded engine): tokens per verify step (accept length, bonus
included) times the median time of a step that drafted nothing (k = 0) divided by the
median time of a step that drafted, both measured by the engine in the stats window. The plain
steps are those of every task on the engines the task ran on (a plain step's cost does not
depend on the task), so a task that never ran at k = 0 still gets its speedup.

Method ``tpot-vs-no-spec-pool``: the median time per output token of the task's requests
on pools without speculation (k = 0) divided by the same on pools with k > 0, both over
the stats window. It compares real requests, but at whatever load each pool had.

Method ``cost-model-estimate`` (pools, no k = 0 pool to compare with): accept length times
the cost model's plain-step time over its speculative-step time at the current concurrency
and the pools' k. Nothing about the baseline was measured, so it is flagged as an estimate.
"""

from __future__ import annotations

from typing import Any

from controller.windows import quantile
from policies.costmodel import RelativeCost
from policies.types import StepCost

_DEFAULT_COST: StepCost = RelativeCost()


def _unknown(why: str) -> dict[str, Any]:
    return {"value": None, "method": None, "is_estimate": False, "explanation": why}


def speedup_for_task(
    tpots_by_backend: dict[str, list[float]],
    k_by_backend: dict[str, int | None],
    accept_length: float | None = None,
    concurrency: int = 1,
    cost: StepCost = _DEFAULT_COST,
) -> dict[str, Any]:
    """Speedup from per-backend TPOT samples; ``k_by_backend[name]`` None = per-request k.

    Without a k = 0 pool to compare with, falls back to the cost model (an estimate)."""
    plain = [v for b, vs in tpots_by_backend.items() if k_by_backend.get(b) == 0 for v in vs]
    spec = [v for b, vs in tpots_by_backend.items() if (k_by_backend.get(b) or 0) > 0 for v in vs]
    if not plain and spec and accept_length is not None:
        return speedup_from_cost_model(
            accept_length, tpots_by_backend, k_by_backend, concurrency, cost
        )
    if not plain or not spec:
        return _unknown(
            "needs TPOT samples of this task on both a k=0 pool and a k>0 pool in the window, "
            "or, for an estimate, on a k>0 pool with reported acceptance"
        )
    base, fast = quantile(plain, 0.5), quantile(spec, 0.5)
    assert base is not None and fast is not None, "non-empty samples have a median"
    if fast <= 0:
        return _unknown("TPOT on the speculative pools measured as zero")
    return {
        "value": round(base / fast, 3),
        "method": "tpot-vs-no-spec-pool",
        "is_estimate": False,
        "explanation": (
            f"median TPOT {base * 1e3:.2f} ms on k=0 pools ({len(plain)} requests) / "
            f"{fast * 1e3:.2f} ms on k>0 pools ({len(spec)} requests), last window; "
            "pools may run at different loads"
        ),
    }


def speedup_from_steps(
    accept_length: float, plain_steps_s: list[float], spec_steps_s: list[float]
) -> dict[str, Any]:
    """Step-time speedup from the engine's own step timings (see module docstring)."""
    plain, spec = quantile(plain_steps_s, 0.5), quantile(spec_steps_s, 0.5)
    assert plain is not None and spec is not None, "callers pass non-empty samples"
    if spec <= 0:
        return _unknown("spec step time measured as zero")
    return {
        "value": round(accept_length * plain / spec, 3),
        "method": "step-times",
        "is_estimate": False,
        "explanation": (
            f"{accept_length:.2f} tokens per verify step x median plain step "
            f"{plain * 1e3:.2f} ms ({len(plain_steps_s)} steps) / median drafting step "
            f"{spec * 1e3:.2f} ms ({len(spec_steps_s)} steps), last window; steps may have "
            "run at different batch sizes"
        ),
    }


def speedup_from_cost_model(
    accept_length: float,
    tpots_by_backend: dict[str, list[float]],
    k_by_backend: dict[str, int | None],
    concurrency: int,
    cost: StepCost,
) -> dict[str, Any]:
    """Estimated speedup of the task's k > 0 pools from the cost model (see module docstring)."""
    weights = {
        b: len(vs) for b, vs in tpots_by_backend.items() if (k_by_backend.get(b) or 0) > 0 and vs
    }
    k = round(sum((k_by_backend[b] or 0) * n for b, n in weights.items()) / sum(weights.values()))
    batch = max(1, concurrency)
    plain_s, spec_s = cost.step_time_s(batch, 0), cost.step_time_s(batch, k)
    if spec_s <= 0:
        return _unknown("the cost model priced the speculative step at zero")
    return {
        "value": round(accept_length * plain_s / spec_s, 3),
        "method": "cost-model-estimate",
        "is_estimate": True,
        "explanation": (
            f"no k=0 pool measured: {accept_length:.2f} tokens per verify step x cost-model "
            f"plain step / speculative step at batch {batch} and k={k} "
            f"({plain_s / spec_s:.3f}); an estimate, not a measurement"
        ),
    }
