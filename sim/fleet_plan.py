"""``draftctl plan``'s search: which pool layout to run a fleet of N instances with.

Recipe: build the candidates (uniform fleets: no-spec, each static k, one batch-size schedule;
task pools: every grouping of the tasks into 2 or 3 pools and every split of the instances,
each pool with the schedule ``export-schedule`` fits to its tasks), simulate each on the
traffic shortened by ``search_scale`` (same shape, fewer requests), then re-simulate the
finalists at full length: the best there is recommended, with its gain over the best uniform
fleet: in goodput for closed-loop traffic, in mean request latency for open-loop traffic
(arrival rates: every fleet that keeps up serves the same tokens). Task pools are routed
as the gateway routes them with the config the plan writes: home pool by task, and load spill
when ``spill_margin`` is given (written to the policy as ``spill_margin``; docs/fleet.md);
``spill_margin="auto"`` tries every layout at each of ``SPILL_MARGINS`` and writes the
recommended one's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from policies.types import TASKS, Task
from sim.fleet_build import FitInputs, build_fleet, standard_layouts
from sim.fleet_config import FleetLayout, FleetSpec, PoolLayout
from sim.fleet_runner import fit_inputs, simulate_fleet
from sim.objective import FIELDS, Objective, objective_of, score
from sim.scenario import Scenario
from sim.workload import Workload

# Task groupings tried for task pools: (pool name, tasks) per pool.
GROUPINGS: tuple[tuple[tuple[str, tuple[Task, ...]], ...], ...] = (
    (("math-code", (Task.MATH, Task.CODE)), ("chat", (Task.CHAT,))),
    (("math", (Task.MATH,)), ("code-chat", (Task.CODE, Task.CHAT))),
    (("math", (Task.MATH,)), ("code", (Task.CODE,)), ("chat", (Task.CHAT,))),
)

Progress = Callable[[str], None]

# The load-spill margins ``spill_margin="auto"`` tries for every task-pool layout (None: route
# by task only). A margin is the policy's ``spill_margin``: in-flight requests per server.
SPILL_MARGINS: tuple[int | None, ...] = (None, 0, 1, 2, 4, 8)
SpillChoice = int | None | Literal["auto"]


def spill_margins(spill_margin: SpillChoice) -> tuple[int | None, ...]:
    """The margins a plan tries: all of ``SPILL_MARGINS`` for "auto", else the one given."""
    return SPILL_MARGINS if spill_margin == "auto" else (spill_margin,)


# Candidates re-simulated at full length, and the gain a pooled layout needs over the best
# uniform fleet there to be recommended (below it, one pool is simpler to run).
NUM_FINALISTS = 3
MIN_GAIN = 0.005


@dataclass(frozen=True)
class PlanResult:
    recommended: str
    best_uniform: str
    search: dict[str, float]  # layout -> its objective's figure on the shortened traffic
    full: dict[str, dict[str, Any]]  # the two finalists' full-length report entries
    layouts: dict[str, FleetLayout]
    objective: Objective = "goodput"

    @property
    def gain_vs_best_uniform(self) -> float:
        """The recommended layout's score over the best uniform fleet's (> 1: better)."""
        return score(self.full[self.recommended], self.objective) / score(
            self.full[self.best_uniform], self.objective
        )


def candidates(
    instances: int, static_spec_tokens: Sequence[int], block_size: int, spill_margin: SpillChoice
) -> list[FleetLayout]:
    """Uniform fleets (oracle and vLLM-AV left out: a bound and a weak baseline) + task pools,
    each at every margin of ``spill_margins(spill_margin)`` (several: the name says which,
    ``-spill<M>`` or ``-nospill``)."""
    margins = spill_margins(spill_margin)
    spec = FleetSpec(
        instances=instances,
        static_spec_tokens=list(static_spec_tokens),
        include_vllm_av=False,
        include_oracle=False,
    )
    out = standard_layouts(spec, block_size)
    for grouping in GROUPINGS:
        for split in _splits(instances, len(grouping)):
            pools = [
                PoolLayout(name=name, instances=n, tasks=list(tasks))
                for (name, tasks), n in zip(grouping, split, strict=True)
            ]
            label = "+".join(f"{name}:{n}" for (name, _), n in zip(grouping, split, strict=True))
            for margin in margins:
                suffix = (
                    ""
                    if len(margins) == 1
                    else f"-spill{margin}"
                    if margin is not None
                    else "-nospill"
                )
                out.append(
                    FleetLayout(name=f"pools-{label}{suffix}", spill_margin=margin, pools=pools)
                )
    return out


def _splits(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to give each of ``parts`` pools at least one of ``total`` instances."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        edges = (0, *cuts, total)
        yield tuple(b - a for a, b in itertools.pairwise(edges))


def scaled(scenario: Scenario, scale: float) -> Scenario:
    """The same traffic with every phase ``scale`` times as long (at least 2 s)."""
    phases = [
        p.model_copy(update={"duration_s": max(2.0, p.duration_s * scale)}) for p in scenario.phases
    ]
    return scenario.model_copy(update={"phases": phases})


def search(
    scenario: Scenario,
    instances: int,
    search_scale: float = 0.25,
    spill_margin: SpillChoice = None,
    static_spec_tokens: Sequence[int] = (3, 5, 7, 11, 15),
    progress: Progress | None = None,
) -> PlanResult:
    """Simulate every candidate on the shortened traffic; the finalists (the search's top
    ``NUM_FINALISTS`` and its best uniform fleet) at full length decide. A pooled layout must
    beat the best uniform finalist by ``MIN_GAIN`` there, else the uniform fleet is simpler."""
    # a smaller block (8: the demo pair's) caps the static candidates at its widest k
    ks = sorted({min(k, scenario.block_size - 1) for k in static_spec_tokens})
    layouts = {c.name: c for c in candidates(instances, ks, scenario.block_size, spill_margin)}
    objective = objective_of(scenario)
    searched = _simulate_all(scaled(scenario, search_scale), layouts, progress)
    figures = {name: float(e[FIELDS[objective]] or 0.0) for name, e in searched.items()}
    scores = {name: score(entry, objective) for name, entry in searched.items()}
    ranked = sorted(scores, key=lambda n: -scores[n])
    best_uniform = next(n for n in ranked if n.startswith("uniform-"))
    workload = Workload(scenario)
    fit = fit_inputs(scenario, workload)
    full = {}
    for name in dict.fromkeys([*ranked[:NUM_FINALISTS], best_uniform]):
        if progress is not None:
            progress(f"full-length run: {name}")
        full[name] = simulate_fleet(scenario, workload, build_fleet(layouts[name], fit))
    best = max(full, key=lambda n: score(full[n], objective))
    uniform = [n for n in full if n.startswith("uniform-")]
    best_uniform = max(uniform, key=lambda n: score(full[n], objective))
    uniform_score = score(full[best_uniform], objective)
    if (
        not best.startswith("uniform-")
        and score(full[best], objective) < (1 + MIN_GAIN) * uniform_score
    ):
        best = best_uniform
    return PlanResult(best, best_uniform, figures, full, layouts, objective)


def _simulate_all(
    scenario: Scenario, layouts: dict[str, FleetLayout], progress: Progress | None
) -> dict[str, dict[str, Any]]:
    workload = Workload(scenario)
    fit: FitInputs = fit_inputs(scenario, workload)
    out: dict[str, dict[str, Any]] = {}
    for name, layout in layouts.items():
        if progress is not None:
            progress(name)
        out[name] = simulate_fleet(scenario, workload, build_fleet(layout, fit))
    return out


def task_homes(layout: dict[str, Any]) -> dict[Task, str]:
    """task -> pool name of a described layout (a single pool is every task's home)."""
    pools: dict[str, Any] = layout["pools"]
    if len(pools) == 1:
        return {task: next(iter(pools)) for task in TASKS}
    return {Task(task): name for name, pool in pools.items() for task in pool["tasks"]}
