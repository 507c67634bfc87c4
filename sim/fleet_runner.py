"""Run every fleet of a scenario on the same requests and collect the report.

Schedules are fitted to what ``draftctl policy export-schedule --models`` would read from a
warmed-up daemon: each task's mean per-position acceptance over the scenario's own requests,
and the traffic's task mix (phases weighted by duration x concurrency, or x arrival rate in
an open-loop scenario). Modelling
assumptions are listed in docs/fleet.md.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from engines.cost_tables import load_cost_table
from policies.types import TASKS, Task
from sim.fleet import FleetServer, Progress
from sim.fleet_bound import homogeneous_bound
from sim.fleet_build import (
    BuiltFleet,
    FitInputs,
    build_fleet,
    instance_choosers,
    make_router,
    standard_layouts,
)
from sim.fleet_config import FleetLayout, FleetSpec
from sim.objective import Objective, objective_of, score
from sim.runner import engine_cost
from sim.scenario import Scenario
from sim.stats import RunStats
from sim.workload import Workload

logger = logging.getLogger(__name__)

# Requests per task averaged for the schedules' acceptance rates.
_RATE_SAMPLES = 200


def fleet_spec(scenario: Scenario) -> FleetSpec:
    if scenario.fleet is None:
        raise ValueError("the scenario has no fleet section")
    return scenario.fleet


def traffic_mix(scenario: Scenario) -> dict[Task, float]:
    """Task shares of the requests: each phase's mix weighted by duration x concurrency (or x
    arrival rate; by duration alone if every phase is idle)."""
    loads = [p.concurrency if p.arrival_rate is None else p.arrival_rate for p in scenario.phases]
    if not any(loads):
        loads = [1.0] * len(loads)
    mix: dict[Task, float] = {}
    for phase, load in zip(scenario.phases, loads, strict=True):
        total = sum(phase.mix.values())
        for task, share in phase.mix.items():
            weight = phase.duration_s * (load or 0.0) * share / total
            mix[task] = mix.get(task, 0.0) + weight
    total = sum(mix.values())
    return {t: w / total for t, w in mix.items() if w > 0}


def task_rates(scenario: Scenario, workload: Workload) -> dict[Task, list[float]]:
    """Each task's mean per-position rates over up to ``_RATE_SAMPLES`` of its requests."""
    found: dict[Task, list[tuple[float, ...]]] = {}
    for phase in range(len(scenario.phases)):
        for index in range(4 * _RATE_SAMPLES):
            spec = workload.request(phase, 0, index)
            rows = found.setdefault(spec.task, [])
            if spec.trace.true_rates is not None and len(rows) < _RATE_SAMPLES:
                rows.append(spec.trace.true_rates)
    rates = {t: _column_means(rows) for t, rows in found.items() if rows}
    # A task with no traffic still needs rates for a pool that names it: the mean of the rest.
    others = list(rates.values())
    for task in TASKS:
        if task not in rates and others:
            rates[task] = _column_means(others)
    return rates


def _column_means(rows: Sequence[Sequence[float]]) -> list[float]:
    return [statistics.fmean(col) for col in zip(*rows, strict=True)]


def fit_inputs(scenario: Scenario, workload: Workload, min_spec_tokens: int = 1) -> FitInputs:
    table = load_cost_table(scenario.resolve(scenario.cost.table))
    return FitInputs(
        rates=task_rates(scenario, workload),
        mix=traffic_mix(scenario),
        cost=engine_cost(scenario, table).snapshot(),
        min_spec_tokens=min_spec_tokens,
        block_size=scenario.block_size,
        max_batch_size=scenario.max_batch_size,
    )


def simulate_fleet(
    scenario: Scenario, workload: Workload, fleet: BuiltFleet, progress: Progress | None = None
) -> dict[str, Any]:
    """One fleet's report entry: the run's figures, TTFT p99 and the layout it ran."""
    table = load_cost_table(scenario.resolve(scenario.cost.table))
    cost = engine_cost(scenario, table)
    choosers = instance_choosers(
        fleet, cost, scenario.block_size, scenario.max_batch_size, scenario
    )
    router = make_router(fleet, scenario.block_size)
    stats = FleetServer(scenario, workload, choosers, cost, router, progress).run()
    out = stats.as_dict()
    out["ttft_p99_s"] = _ttft_p99(stats)
    for phase in stats.phases:
        out["phases"][phase.name]["ttft_p99_s"] = _percentile(phase.ttft_s, 0.99)
    out["layout"] = fleet.describe()
    out["num_spilled"] = getattr(router, "num_spilled", 0)
    return out


def _ttft_p99(stats: RunStats) -> float | None:
    return _percentile([x for p in stats.phases for x in p.ttft_s], 0.99)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def layouts_of(scenario: Scenario) -> list[FleetLayout]:
    spec = fleet_spec(scenario)
    return standard_layouts(spec, scenario.block_size) + list(spec.layouts)


def run_fleets(
    scenario: Scenario, progress: Progress | None = None, layouts: list[FleetLayout] | None = None
) -> dict[str, Any]:
    """Simulate every fleet of the scenario; returns the report object (``fleets`` + context)."""
    workload = Workload(scenario)
    fit = fit_inputs(scenario, workload)
    results: dict[str, Any] = {}
    chosen = layouts if layouts is not None else layouts_of(scenario)
    for layout in chosen:
        started = time.perf_counter()
        fleet = build_fleet(layout, fit)
        results[layout.name] = simulate_fleet(scenario, workload, fleet, progress)
        logger.info("%s simulated in %.1f s", layout.name, time.perf_counter() - started)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "acceptance_source": workload.source,
        "cost_table": str(scenario.cost.table),
        "instances": max(layout.num_instances for layout in chosen),
        "duration_s": scenario.duration_s,
        "phases": [p.model_dump(mode="json") for p in scenario.phases],
        "traffic_mix": {t.value: w for t, w in fit.mix.items()},
        "schedule_rates": {t.value: [round(r, 4) for r in rs] for t, rs in fit.rates.items()},
        "homogeneous_batch_bound": homogeneous_bound(fit),
        "fleets": results,
        "summary": summarise_fleets(results, objective_of(scenario)),
    }


def summarise_fleets(fleets: Mapping[str, Any], objective: Objective = "goodput") -> dict[str, Any]:
    """Each pooled fleet against the uniform ones: the issue's four checks, the ratios in
    ``objective``'s score (goodput; open-loop traffic: 1 / mean request latency). Bounds (a
    fleet with an oracle pool) are compared too but never count as the best uniform fleet."""
    uniform = {n: f for n, f in fleets.items() if n.startswith("uniform-") and not is_bound(f)}
    statics = {n: f for n, f in uniform.items() if n.startswith("uniform-static-k")}
    if not statics or "uniform-no-spec" not in uniform:
        return {}
    best_static = max(statics, key=lambda n: score(statics[n], objective))
    best_uniform = max(uniform, key=lambda n: score(uniform[n], objective))
    out: dict[str, Any] = {
        "objective": objective,
        "best_uniform_static": best_static,
        "best_uniform": best_uniform,
    }
    for name, fleet in fleets.items():
        if name.startswith("uniform-"):
            continue
        out[name] = _checks(fleet, uniform, statics[best_static], uniform[best_uniform], objective)
    return out


def is_bound(fleet: Mapping[str, Any]) -> bool:
    """A fleet with a clairvoyant pool: a ceiling, not something to deploy."""
    return any(p["k_mode"] == "oracle" for p in fleet["layout"]["pools"].values())


def _checks(
    fleet: Mapping[str, Any],
    uniform: Mapping[str, Any],
    best_static: Mapping[str, Any],
    best_uniform: Mapping[str, Any],
    objective: Objective,
) -> dict[str, Any]:
    def ratio(other: Mapping[str, Any]) -> float:
        return score(fleet, objective) / max(1e-12, score(other, objective))

    no_spec = uniform["uniform-no-spec"]["phases"]
    phases = {
        phase: score(figures, objective) / max(1e-12, score(no_spec[phase], objective))
        for phase, figures in fleet["phases"].items()
    }
    out: dict[str, Any] = {
        "vs_best_uniform_static": ratio(best_static),
        "vs_best_uniform": ratio(best_uniform),
        "phases_vs_no_spec": phases,
        "min_phase_vs_no_spec": min(phases.values()),
        "ttft_p99_vs_best_uniform": _ratio_or_none(fleet["ttft_p99_s"], best_uniform["ttft_p99_s"]),
    }
    if "uniform-schedule" in uniform:
        out["vs_uniform_schedule"] = ratio(uniform["uniform-schedule"])
    return out


def _ratio_or_none(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b
