"""Pure pool selection: which pool serves a policy decision best.

Stock vLLM/SGLang fix k per server, so per-request k means routing to a pool started with
that k. A pool whose k can be chosen per request (the embedded engine) serves any k exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.types import Decision, PoolView, served_spec_tokens


def _distance(pool: PoolView, wanted: int) -> int:
    return abs(served_spec_tokens(pool, wanted) - wanted)


def rank_pools(
    pools: Sequence[PoolView], decision: Decision, spill_margin: int | None = None
) -> list[PoolView]:
    """Healthy pools, best first.

    Order: the decision's named pool (if healthy), then by distance between the pool's k and
    the wanted k, then fewest in-flight requests, then the smaller k (never draft more than
    needed on a tie), then name for determinism. A pool whose k is set per request
    (``is_adjustable``) serves any k up to its largest exactly. The gateway tries them in this
    order, so the tail is the retry plan.

    Load spill (``spill_margin``, the policy file's): when the first pool holds more than
    ``spill_margin`` in-flight requests per server above the least-loaded healthy pool, that
    pool goes first instead (the request then runs at that pool's k): task pools sized for one
    mix must not queue while another pool idles.
    """
    healthy = [p for p in pools if p.is_healthy]
    wanted = decision.spec_tokens
    ranked = sorted(
        healthy,
        key=lambda p: (
            p.name != decision.pool,
            _distance(p, wanted),
            p.num_inflight,
            p.spec_tokens,
            p.name,
        ),
    )
    if spill_margin is not None and len(ranked) > 1:
        lightest = min(ranked, key=lambda p: p.load_per_server)  # first of equals: ranked order
        if ranked[0].load_per_server - lightest.load_per_server > spill_margin:
            ranked.remove(lightest)
            ranked.insert(0, lightest)
    return ranked
