"""Pool selection: the healthy pool whose k serves the decision best; ties by in-flight."""

from __future__ import annotations

from policies.routing import rank_pools
from policies.types import Decision, PoolView, served_spec_tokens


def _pool(
    name: str, k: int, inflight: int = 0, healthy: bool = True, adjustable: bool = False
) -> PoolView:
    return PoolView(name, k, 16, inflight, healthy, is_adjustable=adjustable)


def _names(pools: list[PoolView]) -> list[str]:
    return [p.name for p in pools]


def test_exact_k_first_then_nearest() -> None:
    pools = [_pool("k0", 0), _pool("k4", 4), _pool("k7", 7), _pool("k15", 15)]
    assert _names(rank_pools(pools, Decision(7, "r"))) == ["k7", "k4", "k0", "k15"]
    assert _names(rank_pools(pools, Decision(0, "r")))[0] == "k0"
    assert _names(rank_pools(pools, Decision(12, "r")))[0] == "k15"


def test_ties_go_to_least_inflight_then_smaller_k() -> None:
    pools = [_pool("a", 7, inflight=3), _pool("b", 7, inflight=1), _pool("c", 7, inflight=2)]
    assert _names(rank_pools(pools, Decision(7, "r"))) == ["b", "c", "a"]
    # k=9 is 2 away from both 7 and 11: equal load prefers the smaller k.
    assert _names(rank_pools([_pool("k11", 11), _pool("k7", 7)], Decision(9, "r"))) == ["k7", "k11"]


def test_unhealthy_pools_are_left_out_and_named_pool_wins() -> None:
    pools = [_pool("k7", 7, healthy=False), _pool("k4", 4), _pool("k0", 0)]
    assert _names(rank_pools(pools, Decision(7, "r"))) == ["k4", "k0"]
    assert _names(rank_pools(pools, Decision(7, "r", pool="k0")))[0] == "k0"
    assert rank_pools([_pool("k7", 7, healthy=False)], Decision(7, "r")) == []


def test_adjustable_engine_serves_any_k_exactly() -> None:
    pools = [_pool("k4", 4), _pool("embedded", 15, adjustable=True)]
    ranked = rank_pools(pools, Decision(9, "r"))
    assert _names(ranked)[0] == "embedded"
    assert served_spec_tokens(ranked[0], 9) == 9
    assert served_spec_tokens(ranked[0], 0) == 0  # drafting off is served exactly too
    assert served_spec_tokens(ranked[0], 20) == 15  # never beyond the block
    assert served_spec_tokens(pools[0], 9) == 4


def test_load_spill_sends_the_request_to_the_lightest_pool_past_the_margin() -> None:
    """Per-server in-flight: math's 2 servers hold 30 (15 each), chat's 3 hold 6 (2 each)."""
    math = PoolView("math", 15, 16, 30, num_servers=2)
    chat = PoolView("chat", 7, 16, 6, num_servers=3)
    wanted = Decision(15, "math wants the k=15 pool")
    assert [p.name for p in rank_pools([math, chat], wanted)] == ["math", "chat"]
    assert [p.name for p in rank_pools([math, chat], wanted, 13)] == ["math", "chat"]  # gap 13
    assert [p.name for p in rank_pools([math, chat], wanted, 12)] == ["chat", "math"]
    # a margin never spills to an unhealthy pool, and a lone pool stays
    sick = PoolView("chat", 7, 16, 0, is_healthy=False)
    assert [p.name for p in rank_pools([math, sick], wanted, 0)] == ["math"]
    assert [p.name for p in rank_pools([math], wanted, 0)] == ["math"]


def test_spill_margin_is_part_of_the_policy_file() -> None:
    from policies.model import PolicySpec

    assert PolicySpec().spill_margin is None
    assert PolicySpec(spill_margin=8).spill_margin == 8
