"""The requests of a scenario, identical for every policy.

Request j of client c in phase f is drawn from its own seeded generator, so each policy sees
the same task, lengths and acceptance trace for it however fast it gets there.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from policies.types import Task
from sim.scenario import Scenario
from sim.traces import AcceptanceTrace, TraceRecord, load_traces, parametric_trace


@dataclass(frozen=True)
class RequestSpec:
    key: tuple[int, int, int]  # (phase, client, index)
    task: Task
    prompt_tokens: int
    trace: AcceptanceTrace

    @property
    def num_output_tokens(self) -> int:
        return self.trace.num_output_tokens


class Workload:
    """Lazily generated, memoised requests (shared across policies)."""

    def __init__(self, scenario: Scenario):
        self._scenario = scenario
        self._cache: dict[tuple[int, int, int], RequestSpec] = {}
        self._traces: dict[Task, list[TraceRecord]] = {}
        path = scenario.acceptance.traces
        if path is not None:
            resolved = scenario.resolve(path)
            if not resolved.exists():
                raise ValueError(
                    f"acceptance.traces: {resolved} does not exist; point it at a *.jsonl trace "
                    "file (or a folder of them), or remove the key for the parametric model"
                )
            self._traces = load_traces(resolved, scenario.block_size)
        self.source = _describe(path, self._traces)

    def request(self, phase: int, client: int, index: int) -> RequestSpec:
        key = (phase, client, index)
        spec = self._cache.get(key)
        if spec is None:
            spec = self._draw(key)
            self._cache[key] = spec
        return spec

    def _draw(self, key: tuple[int, int, int]) -> RequestSpec:
        scenario = self._scenario
        rng = random.Random(f"{scenario.seed}:{key[0]}:{key[1]}:{key[2]}")
        mix = scenario.phases[key[0]].mix
        tasks = [t for t in mix if mix[t] > 0]
        task = rng.choices(tasks, weights=[mix[t] for t in tasks])[0]
        records = self._traces.get(task)
        lengths = scenario.lengths_for(task)
        if records:
            record = rng.choice(records)
            prompt = record.prompt_tokens
            if prompt is None:
                prompt = rng.randint(*lengths.prompt_tokens)
            return RequestSpec(key, task, prompt, record.trace)
        if self._traces:
            raise ValueError(
                f"acceptance.traces holds no {task.value!r} requests but the mix of phase "
                f"{scenario.phases[key[0]].name!r} asks for them; record some or drop the task"
            )
        prompt = rng.randint(*lengths.prompt_tokens)
        output = rng.randint(*lengths.output_tokens)
        model = scenario.acceptance.parametric.get(task)
        if model is None:
            raise ValueError(
                f"acceptance.parametric has no entry for task {task.value!r} and no traces "
                "were found for it; add one or record traces"
            )
        trace = parametric_trace(model, scenario.block_size, output, rng)
        return RequestSpec(key, task, prompt, trace)


def _describe(path: Path | None, traces: dict[Task, list[TraceRecord]]) -> str:
    if not traces:
        return "parametric (assumed, not measured)"
    counts = ", ".join(f"{task.value} {len(records)}" for task, records in traces.items())
    return f"traces {path} ({counts} requests)"
