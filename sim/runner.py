"""Run every policy of a scenario on the same requests and collect the report."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from engines.cost_tables import load_cost_table
from policies.costmodel import CostModel, CostTable
from sim.choosers import FixedK, GoodputChooser, Informed, KChooser, Oracle
from sim.ragged_choosers import ragged_choosers
from sim.scenario import Scenario
from sim.server import Progress, SimServer
from sim.workload import Workload

logger = logging.getLogger(__name__)


@dataclass
class EngineCost(CostModel):
    """The simulated engine's true step cost: the policy's formula plus a host overhead."""

    step_overhead_s: float = 0.0

    def base_step_time_s(self, batch_size: float, mean_width: float, drafting: float) -> float:
        forward = super().base_step_time_s(batch_size, mean_width, drafting)
        return forward + self.step_overhead_s


def engine_cost(scenario: Scenario, table: CostTable) -> EngineCost:
    """The simulated engine's step cost (table + draft forward + ``cost.step_overhead_s``)."""
    cost = scenario.cost
    return EngineCost(
        table=table,
        block_size=scenario.block_size,
        verify_width_multiple=cost.verify_width_multiple,
        draft_cost_fraction=cost.draft_cost_fraction,
        step_overhead_s=cost.step_overhead_s,
    )


def build_choosers(scenario: Scenario, table: CostTable) -> list[KChooser]:
    chosen = scenario.policies
    max_k = scenario.block_size - 1
    choosers: list[KChooser] = [FixedK(0)]
    for k in chosen.static_spec_tokens:
        if not 1 <= k <= max_k:
            raise ValueError(f"policies.static_spec_tokens: k={k} outside [1, {max_k}]")
        choosers.append(FixedK(k))
    min_k = min(chosen.min_spec_tokens, max_k)
    padded = scenario.cost.batch_verify == "padded"
    multiple = scenario.cost.engine_multiple
    goodput = GoodputChooser(
        chosen.goodput, table, scenario.block_size, scenario.seed, min_k, padded, None, multiple
    )
    choosers.append(goodput)
    if chosen.include_informed:
        informed = Informed(chosen.goodput, table, scenario.block_size, min_k, padded, multiple)
        choosers.append(informed)
    choosers.extend(ragged_choosers(scenario, table, engine_cost(scenario, table)))
    if chosen.include_oracle:
        oracle = Oracle(engine_cost(scenario, table), scenario.block_size, min_k, padded)
        choosers.append(oracle)
    return choosers


def run_scenario(scenario: Scenario, progress: Progress | None = None) -> dict[str, Any]:
    """Simulate every policy; returns the report object (``policies`` + context)."""
    table = load_cost_table(scenario.resolve(scenario.cost.table))
    workload = Workload(scenario)
    results: dict[str, Any] = {}
    for chooser in build_choosers(scenario, table):
        started = time.perf_counter()
        server = SimServer(scenario, workload, chooser, engine_cost(scenario, table), progress)
        results[chooser.name] = server.run().as_dict()
        logger.info("%s simulated in %.1f s", chooser.name, time.perf_counter() - started)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "acceptance_source": workload.source,
        "cost_table": str(scenario.cost.table),
        "cost_table_device": table.device,
        "duration_s": scenario.duration_s,
        "phases": [p.model_dump(mode="json") for p in scenario.phases],
        "policies": results,
        "summary": summarise(results),
    }


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """Goodput's ratios against the best static k, no-spec and the oracle (overall + phase)."""
    statics = {n: r for n, r in results.items() if n.startswith("static-k")}
    goodput = results.get("goodput")
    if goodput is None or not statics:
        return {}
    best_name = max(statics, key=lambda n: statics[n]["goodput_tok_s"])
    out: dict[str, Any] = {
        "best_static": best_name,
        "vs_best_static": goodput["goodput_tok_s"] / statics[best_name]["goodput_tok_s"],
        "vs_no_spec": goodput["goodput_tok_s"] / results["no-spec"]["goodput_tok_s"],
    }
    if "oracle" in results:
        out["vs_oracle"] = goodput["goodput_tok_s"] / results["oracle"]["goodput_tok_s"]
    out["phases"] = {}
    for phase, figures in goodput["phases"].items():
        best = max(s["phases"][phase]["goodput_tok_s"] for s in statics.values())
        row = {"vs_best_static": figures["goodput_tok_s"] / best}
        if "oracle" in results:
            row["vs_oracle"] = figures["goodput_tok_s"] / max(
                1e-9, results["oracle"]["phases"][phase]["goodput_tok_s"]
            )
        out["phases"][phase] = row
    return out
