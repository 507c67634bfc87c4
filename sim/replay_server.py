"""The simulated server of a replay: recorded arrivals instead of a scenario's clients.

``ReplayServer`` runs one ``sim.instance.Instance`` (the same admission, prefill, decode
steps and k choosers as ``SimServer``) with the scenario's phases replaced by the trace's
requests: each arrives at its recorded time or,
when it was a closed-loop client's next request, ``gap_s`` after its predecessor's simulated
end. It runs until every request has finished.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.costmodel import CostModel
from policies.model import PolicySpec
from policies.observation import step_observation
from policies.types import Policy, Task, max_spec_tokens
from sim.choosers import KChooser
from sim.instance import Instance
from sim.request import SimRequest
from sim.scenario import Costs
from sim.stats import RunStats
from sim.traces import AcceptanceTrace
from sim.workload import RequestSpec

_HORIZON_S = 1e9  # the replay ends when its last request does, not at a phase's end


@dataclass(frozen=True)
class ReplayRequest:
    """One recorded request (times in seconds from the trace's first arrival)."""

    index: int
    task: Task
    prompt_tokens: int
    trace: AcceptanceTrace
    arrival_s: float
    end_s: float
    ttft_s: float | None
    decode_s: float | None
    predecessor: int | None  # the request whose end this one followed (closed loop)
    gap_s: float  # seconds after that end
    recorded_k: float
    recorded_accept: float | None
    concurrency: int = 1  # the load the gateway saw when it arrived
    step_times: tuple[tuple[int, float], ...] = ()  # (k, seconds) of its measured steps

    @property
    def recorded_tpot_s(self) -> float | None:
        generated = self.trace.num_output_tokens - 1
        return None if self.decode_s is None or generated < 1 else self.decode_s / generated


class ReplayServer:
    def __init__(
        self,
        requests: Sequence[ReplayRequest],
        chooser: KChooser,
        cost: CostModel,
        costs: Costs,
        max_batch_size: int,
    ):
        self.stats = RunStats([("replay", _HORIZON_S)], _HORIZON_S)
        self._instance = Instance(max_batch_size, costs, chooser, cost, self.stats, self._finish)
        self._requests = list(requests)
        self._followers: dict[int, list[int]] = {}
        self._pending: list[tuple[float, int]] = []  # (arrival, index): a heap
        for request in self._requests:
            if request.predecessor is None:
                heapq.heappush(self._pending, (request.arrival_s, request.index))
            else:
                self._followers.setdefault(request.predecessor, []).append(request.index)
        self._done: list[SimRequest] = []

    def run(self) -> list[tuple[float, float, float | None, float | None, int]]:
        """Every request's (arrival, end, ttft, tpot, output tokens), simulated."""
        instance = self._instance
        while self._pending or instance.is_busy:
            if not instance.is_busy:  # idle: its clock jumps to the next arrival
                self._arrive()
                continue
            while self._pending and self._pending[0][0] <= instance.now_s:
                self._arrive()
            instance.step()
        return [_row(r) for r in self._done]

    def _arrive(self) -> None:
        arrival, index = heapq.heappop(self._pending)
        request = self._requests[index]
        spec = RequestSpec((0, index, 0), request.task, request.prompt_tokens, request.trace)
        self._instance.submit(SimRequest(spec=spec, client=index, arrival_s=arrival))

    def _finish(self, request: SimRequest, now_s: float) -> None:
        self._done.append(request)
        for follower in self._followers.get(request.client, []):
            arrival = now_s + self._requests[follower].gap_s
            heapq.heappush(self._pending, (arrival, follower))

    def mean_spec_tokens(self) -> float:
        ks = [k for r in self._done for k in r.k_history]
        return statistics.fmean(ks) if ks else 0.0

    def mean_accept_length(self) -> float | None:
        lengths = [
            length
            for r in self._done
            for k, length in zip(r.k_history, r.accept_history, strict=True)
            if k > 0
        ]
        return statistics.fmean(lengths) if lengths else None


def _row(request: SimRequest) -> tuple[float, float, float | None, float | None, int]:
    assert request.first_token_s is not None and request.finish_s is not None, "unfinished"
    generated = request.spec.num_output_tokens - 1
    tpot = (request.finish_s - request.first_token_s) / generated if generated > 0 else None
    return (
        request.arrival_s,
        request.finish_s,
        request.first_token_s - request.arrival_s,
        tpot,
        request.spec.num_output_tokens,
    )


class ReplayChooser:
    """A per-request policy (static) asked per request per step, as the embedded engine asks
    it: the step's batch size as the load, the request's recent steps, no learned rates."""

    name = "policy"

    def __init__(self, spec: PolicySpec, policy: Policy, block_size: int, seed: int):
        self._spec = spec
        self._policy = policy
        self._block_size = block_size
        self._rng = random.Random(f"replay:{seed}")

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        bounds = self._spec.bounds_for(self._block_size)
        ceiling = max_spec_tokens(self._block_size)
        out = []
        for request in batch:
            observation = step_observation(
                task=request.spec.task,
                confidence=1.0,
                batch_size=len(batch),
                bounds=bounds,
                block_size=self._block_size,
                learned={},
                accept_lengths=request.accept_history[-32:],
                spec_tokens=request.k_history[-32:],
                step_index=request.num_steps,
                now_s=now_s,
                rng_u=self._rng.random(),
            )
            out.append(min(ceiling, self._policy.decide(observation).spec_tokens))
        return out

    def record(self, *_: Any) -> None:
        return None
