"""Which instance of a simulated fleet serves a request.

``least-loaded`` and ``round-robin`` are the uniform fleets' routers. ``task-pools`` is what
draftctl's gateway does with the config ``draftctl plan`` writes: the static policy maps the
request's task to its home pool's k (``policies.static``), ``policies.routing.rank_pools``
ranks the pools by that k, and inside the pool the least-loaded server takes it (rotating
ties, as ``engines/pool.py`` does). ``spill_margin`` is the policy file's load spill, through
the same ``rank_pools``: the request goes to the least-loaded pool when its home pool holds
more than ``spill_margin`` requests per server above it (docs/fleet.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from policies.model import SpecTokens, StaticSpec
from policies.routing import rank_pools
from policies.static import StaticPolicy
from policies.types import Observation, PoolView, Task, max_spec_tokens
from sim.instance import Instance


class Router(Protocol):
    def route(self, task: Task, instances: Sequence[Instance]) -> int: ...


class LeastLoaded:
    """The instance with the fewest requests (running + waiting); ties rotate."""

    def __init__(self) -> None:
        self._turn = 0

    def route(self, task: Task, instances: Sequence[Instance]) -> int:
        return self.pick(instances, range(len(instances)))

    def pick(self, instances: Sequence[Instance], among: Sequence[int]) -> int:
        self._turn += 1
        start = self._turn % len(among)
        rotated = list(among[start:]) + list(among[:start])
        return min(rotated, key=lambda i: instances[i].load)


class RoundRobin:
    def __init__(self) -> None:
        self._turn = -1

    def route(self, task: Task, instances: Sequence[Instance]) -> int:
        self._turn = (self._turn + 1) % len(instances)
        return self._turn


class TaskPools:
    """Home pool by task through the gateway's own policy and ranking; optional spill."""

    def __init__(
        self,
        pools: dict[str, tuple[int, list[int]]],
        homes: dict[Task, str],
        block_size: int,
        spill_margin: int | None,
    ):
        """``pools``: name -> (k the servers run, instance indices); ``homes``: task -> pool."""
        ks = [k for k, _ in pools.values()]
        if len(set(ks)) != len(ks):
            raise ValueError(f"task pools need distinct k (the gateway routes by k), got {ks}")
        self._pools = pools
        table: dict[Task, list[SpecTokens]] = {t: [pools[n][0]] for t, n in homes.items()}
        self._policy = StaticPolicy(StaticSpec(concurrency_bands=[], spec_tokens=table))
        self._block_size = block_size
        self._spill_margin = spill_margin
        self._least = LeastLoaded()
        self.num_spilled = 0

    def route(self, task: Task, instances: Sequence[Instance]) -> int:
        views = [
            PoolView(
                name,
                k,
                self._block_size,
                sum(instances[i].load for i in members),
                num_servers=len(members),
            )
            for name, (k, members) in self._pools.items()
        ]
        observation = Observation(
            task=task,
            confidence=1.0,
            concurrency=sum(v.num_inflight for v in views),
            min_spec_tokens=1,
            max_spec_tokens=max_spec_tokens(self._block_size),
            block_size=self._block_size,
            pools=tuple(views),
        )
        decision = self._policy.decide(observation)
        home = rank_pools(views, decision)[0].name
        pool = rank_pools(views, decision, self._spill_margin)[0].name
        if pool != home:
            self.num_spilled += 1
        return self._least.pick(instances, self._pools[pool][1])
