"""From a fleet layout to runnable parts: each pool's k mode resolved, its choosers, a router.

A ``schedule`` pool gets the ``num_speculative_tokens_per_batch_size`` ranges that
``draftctl policy export-schedule`` computes (``policies.schedule.build_schedule``) for the
pool's task mix, from per-task acceptance rates and the engine's step cost. Task pools need
distinct server k, because the gateway routes by k: a schedule pool whose cap was left open
takes its schedule's largest k, lowered by one (and refitted) while another pool has it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.baselines.base import StepPolicy
from policies.baselines.fixed import FixedStep
from policies.baselines.schedule import BatchSizeSchedule
from policies.baselines.vllm_av import VllmAdaptiveVerification, VllmAvSettings
from policies.costmodel import CostModel
from policies.schedule import build_schedule
from policies.types import StepCost, Task, max_spec_tokens
from sim.choosers import KChooser, Oracle, StepChooser
from sim.fleet_config import RAGGED_MODES, FleetLayout, FleetSpec, KMode, PoolLayout, RouterKind
from sim.ragged_choosers import AllocatorChooser, VllmAvRaggedChooser
from sim.router import LeastLoaded, RoundRobin, Router, TaskPools
from sim.scenario import Scenario

Rates = Mapping[Task, Sequence[float]]
Ranges = tuple[tuple[int, int, int], ...]  # vLLM's [[batch_start, batch_end, k], ...]


@dataclass(frozen=True)
class FitInputs:
    """What schedules are fitted to: per-task rates, the traffic mix, the step cost."""

    rates: Rates
    mix: Mapping[Task, float]
    cost: StepCost
    min_spec_tokens: int
    block_size: int
    max_batch_size: int


@dataclass(frozen=True)
class BuiltPool:
    name: str
    instances: int
    tasks: tuple[Task, ...]
    k_mode: KMode
    spec_tokens: int  # the servers' num_speculative_tokens
    schedule: Ranges = ()  # schedule pools only

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "instances": self.instances,
            "tasks": [t.value for t in self.tasks],
            "k_mode": self.k_mode,
            "num_speculative_tokens": self.spec_tokens,
        }
        if self.schedule:
            out["num_speculative_tokens_per_batch_size"] = [list(r) for r in self.schedule]
        return out


@dataclass(frozen=True)
class BuiltFleet:
    name: str
    router: RouterKind
    spill_margin: int | None
    pools: tuple[BuiltPool, ...] = field(default_factory=tuple)

    def describe(self) -> dict[str, Any]:
        return {
            "router": self.router,
            "spill_margin": self.spill_margin,
            "pools": {p.name: p.describe() for p in self.pools},
        }


def standard_layouts(spec: FleetSpec, block_size: int) -> list[FleetLayout]:
    """uniform-no-spec, uniform-static-k<N>, uniform-schedule, uniform-vllm-av, uniform-oracle."""
    top = max_spec_tokens(block_size)
    pools: list[tuple[str, PoolLayout]] = [
        ("uniform-no-spec", _uniform_pool(spec, "fixed", 0)),
    ]
    for k in spec.static_spec_tokens:
        if not 1 <= k <= top:
            raise ValueError(f"fleet.static_spec_tokens: k={k} outside [1, {top}]")
        pools.append((f"uniform-static-k{k}", _uniform_pool(spec, "fixed", k)))
    pools.append(("uniform-schedule", _uniform_pool(spec, "schedule", top)))
    if spec.include_vllm_av:
        pools.append(("uniform-vllm-av", _uniform_pool(spec, "vllm-av", top)))
    if spec.include_oracle:
        pools.append(("uniform-oracle", _uniform_pool(spec, "oracle", top)))
    return [FleetLayout(name=n, router=spec.uniform_router, pools=[p]) for n, p in pools]


def _uniform_pool(spec: FleetSpec, mode: KMode, k: int) -> PoolLayout:
    return PoolLayout(name="all", instances=spec.instances, k_mode=mode, spec_tokens=k)


def build_fleet(layout: FleetLayout, fit: FitInputs) -> BuiltFleet:
    """Resolve every pool's server k and schedule (see the module docstring)."""
    built: list[BuiltPool] = []
    taken: set[int] = set()
    for pool in layout.pools:
        resolved = _resolve(pool, layout, fit, taken)
        if layout.router == "task-pools":
            taken.add(resolved.spec_tokens)
        built.append(resolved)
    return BuiltFleet(layout.name, layout.router, layout.spill_margin, tuple(built))


def _resolve(pool: PoolLayout, layout: FleetLayout, fit: FitInputs, taken: set[int]) -> BuiltPool:
    tasks = tuple(pool.tasks)
    top = max_spec_tokens(fit.block_size)
    if pool.k_mode != "schedule":
        k = top if pool.spec_tokens is None else pool.spec_tokens
        while pool.k_mode in RAGGED_MODES and k > 0 and k in taken:  # distinct k per pool
            k -= 1
        return BuiltPool(pool.name, pool.instances, tasks, pool.k_mode, k)
    mix = _pool_mix(fit.mix, tasks if layout.router == "task-pools" else ())
    cap = top if pool.spec_tokens is None else pool.spec_tokens
    ranges = _schedule(fit, mix, cap)
    if pool.spec_tokens is None:  # open cap: the schedule's largest k, unique among pools
        cap = max(r[2] for r in ranges)
        while cap > 0 and cap in taken:
            cap -= 1
            ranges = _schedule(fit, mix, cap)
    return BuiltPool(pool.name, pool.instances, tasks, "schedule", cap, ranges)


def _pool_mix(mix: Mapping[Task, float], tasks: Sequence[Task]) -> dict[Task, float]:
    """The traffic mix restricted to a pool's home tasks (all of it for a uniform pool)."""
    chosen = {t: w for t, w in mix.items() if not tasks or t in tasks}
    if sum(chosen.values()) <= 0:  # a pool whose tasks carry no traffic: weigh them equally
        chosen = {t: 1.0 for t in tasks}
    return chosen


def _schedule(fit: FitInputs, mix: Mapping[Task, float], cap: int) -> Ranges:
    if cap < 1:
        return ((1, fit.max_batch_size, 0),)
    ranges = build_schedule(fit.rates, mix, fit.cost, fit.min_spec_tokens, cap, fit.max_batch_size)
    return tuple((r.batch_start, r.batch_end, r.spec_tokens) for r in ranges)


def step_policy(pool: BuiltPool, cost: StepCost, max_batch_size: int) -> StepPolicy:
    """A fresh policy for one instance of ``pool`` (vLLM's adaptive verification keeps state)."""
    if pool.k_mode == "fixed":
        return FixedStep(pool.spec_tokens)
    if pool.k_mode == "schedule":
        return BatchSizeSchedule.from_lists(pool.schedule, pool.spec_tokens)
    assert pool.k_mode == "vllm-av", f"no step policy for k_mode {pool.k_mode}"
    av = VllmAdaptiveVerification(VllmAvSettings(max_spec_tokens=pool.spec_tokens), cost)
    av.prepare(max_batch_size)
    return av


def instance_choosers(
    fleet: BuiltFleet,
    cost: CostModel,
    block_size: int,
    max_batch_size: int,
    scenario: Scenario | None = None,
) -> list[KChooser]:
    """One chooser per instance, pools in order (``scenario``: what ragged pools need)."""
    snapshot = cost.snapshot()
    out: list[KChooser] = []
    for index, pool in enumerate(fleet.pools):
        for instance in range(pool.instances):
            if pool.k_mode == "oracle":
                out.append(Oracle(cost, block_size, 1, padded=True))
            elif pool.k_mode in RAGGED_MODES:
                if scenario is None:
                    raise ValueError(f"pool {pool.name}: ragged k_mode needs the scenario")
                out.append(_ragged_chooser(pool, cost, scenario, 1000 * index + instance))
            else:
                out.append(StepChooser(step_policy(pool, snapshot, max_batch_size), block_size))
    return out


def make_router(fleet: BuiltFleet, block_size: int) -> Router:
    if fleet.router == "least-loaded":
        return LeastLoaded()
    if fleet.router == "round-robin":
        return RoundRobin()
    pools: dict[str, tuple[int, list[int]]] = {}
    homes: dict[Task, str] = {}
    start = 0
    for pool in fleet.pools:
        pools[pool.name] = (pool.spec_tokens, list(range(start, start + pool.instances)))
        start += pool.instances
        homes.update({task: pool.name for task in pool.tasks})
    return TaskPools(pools, homes, block_size, fleet.spill_margin)


def _ragged_chooser(pool: BuiltPool, cost: CostModel, scenario: Scenario, key: int) -> KChooser:
    """A ragged server's chooser, charged at its own widths (``engine_costs``)."""
    chosen = scenario.policies
    auc = scenario.acceptance.confidence_auc
    block = scenario.block_size
    seed = scenario.seed * 7919 + key
    chooser: AllocatorChooser | VllmAvRaggedChooser
    if pool.k_mode == "ragged-allocator":
        min_k = min(chosen.min_spec_tokens, pool.spec_tokens)
        chooser = AllocatorChooser(chosen.goodput, cost.table, cost, block, min_k, auc, seed)
    else:
        chooser = VllmAvRaggedChooser(chosen.goodput, cost.table, cost, block, auc, seed)
    chooser.engine_costs = scenario.cost.model_copy(update={"batch_verify": "ragged"})
    return chooser
