"""Pure pool selection: which pool serves a policy decision best.

Stock vLLM/SGLang fix k per server, so per-request k means routing to a pool started with
that k. A pool whose k can be chosen per request (the embedded engine) serves any k exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from policies.types import Decision, PoolView


def _distance(pool: PoolView, wanted: int, adjustable: frozenset[str]) -> int:
    if pool.name in adjustable:
        return 0 if wanted <= pool.block_size - 1 else wanted - (pool.block_size - 1)
    return abs(pool.spec_tokens - wanted)


def rank_pools(
    pools: Sequence[PoolView],
    decision: Decision,
    adjustable: Iterable[str] = (),
) -> list[PoolView]:
    """Healthy pools, best first.

    Order: the decision's named pool (if healthy), then by distance between the pool's k and
    the wanted k, then fewest in-flight requests, then the smaller k (never draft more than
    needed on a tie), then name for determinism. ``adjustable`` names pools whose k is set
    per request. The gateway tries them in this order, so the tail is the retry plan.
    """
    flexible = frozenset(adjustable)
    healthy = [p for p in pools if p.is_healthy]
    wanted = decision.spec_tokens
    ranked = sorted(
        healthy,
        key=lambda p: (
            p.name != decision.pool,
            _distance(p, wanted, flexible),
            p.num_inflight,
            p.spec_tokens,
            p.name,
        ),
    )
    return ranked


def served_spec_tokens(pool: PoolView, decision: Decision, adjustable: Iterable[str] = ()) -> int:
    """The k a request routed to ``pool`` will actually run with."""
    if pool.name in frozenset(adjustable):
        return min(decision.spec_tokens, pool.block_size - 1)
    return pool.spec_tokens
