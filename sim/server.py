"""A discrete-event continuous-batching server running one k chooser over a scenario.

Recipe per iteration: phase changes (clients join) -> admit waiting requests (a prefill step
emits their first token) -> otherwise one decode step: the chooser picks k per request,
the step costs T(B, mean padded verify width) + the draft forward (``cost.batch_verify``:
ragged, or padded to the widest row as the embedded engine runs it), each request advances by
its accepted drafts + 1, finished requests free their client, which sends its next request.
Closed loop: a phase with concurrency N keeps N clients busy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from policies.costmodel import CostModel, padded_width
from sim.choosers import KChooser
from sim.request import SimRequest
from sim.scenario import Costs, Scenario
from sim.stats import RunStats
from sim.workload import Workload

Progress = Callable[[float], None]


class SimServer:
    def __init__(
        self,
        scenario: Scenario,
        workload: Workload,
        chooser: KChooser,
        cost: CostModel,
        progress: Progress | None = None,
    ):
        self._scenario = scenario
        self._workload = workload
        self._chooser = chooser
        self._cost = cost
        self._progress = progress
        self.stats = RunStats([(p.name, p.duration_s) for p in scenario.phases], scenario.bin_s)
        self._waiting: deque[SimRequest] = deque()
        self._running: list[SimRequest] = []
        self._counters: dict[tuple[int, int], int] = {}
        self._phase = -1
        self.now_s = 0.0

    def run(self) -> RunStats:
        end = self.stats.duration_s
        reported = 0.0
        while self.now_s < end:
            self._enter_phases()
            if not self._running and not self._waiting:
                self.now_s = self._next_phase_start()
            elif not self._admit():
                self._decode_step()
            if self._progress is not None and self.now_s - reported >= 1.0:
                self._progress(min(self.now_s, end) - reported)
                reported = min(self.now_s, end)
        if self._progress is not None:
            self._progress(end - reported)
        return self.stats

    def _next_phase_start(self) -> float:
        if self._phase + 1 < len(self._scenario.phases):
            return self.stats.phase_start(self._phase + 1)
        return self.stats.duration_s

    def _enter_phases(self) -> None:
        phases = self._scenario.phases
        while self._phase + 1 < len(phases) and self.now_s >= self.stats.phase_start(
            self._phase + 1
        ):
            self._phase += 1
            start = self.stats.phase_start(self._phase)
            busy = {r.client for r in self._running} | {r.client for r in self._waiting}
            for client in range(phases[self._phase].concurrency):
                if client not in busy:
                    self._submit(self._phase, client, start)

    def _submit(self, phase: int, client: int, arrival_s: float) -> None:
        index = self._counters.get((phase, client), 0)
        self._counters[(phase, client)] = index + 1
        spec = self._workload.request(phase, client, index)
        self._waiting.append(SimRequest(spec=spec, client=client, arrival_s=arrival_s))

    def _admit(self) -> bool:
        """Prefill waiting requests that fit; returns whether a prefill step ran."""
        admitted: list[SimRequest] = []
        while self._waiting and len(self._running) < self._scenario.max_batch_size:
            admitted.append(self._waiting.popleft())
        if not admitted:
            return False
        cost = self._scenario.cost
        prompt = sum(r.spec.prompt_tokens for r in admitted)
        forwards = len(admitted) if cost.prefill_batching == "per_request" else 1
        self.now_s += forwards * cost.prefill_base_s + cost.prefill_s_per_token * prompt
        for request in admitted:
            request.first_token_s = self.now_s
            request.position = 1
            self.stats.add_first_token(request.arrival_s, self.now_s - request.arrival_s)
        self.stats.add_tokens(self.now_s, len(admitted))
        self._running.extend(admitted)
        self._retire([r for r in admitted if r.remaining <= 0])
        return True

    def _decode_step(self) -> None:
        batch = self._running
        size = len(batch)
        ks = self._chooser.choose(batch, self.now_s)
        mean_width, drafting = batch_shape(ks, self._scenario.cost)
        # A policy that read the draft's confidence drafted before it chose k: rows it then
        # gave k = 0 still paid for their draft.
        drafted = getattr(self._chooser, "last_drafted_share", None)
        if drafted is not None:
            drafting = max(drafting, drafted)
        seconds = self._cost.base_step_time_s(size, mean_width, drafting)
        self.now_s += seconds
        emitted = [r.advance(k) for r, k in zip(batch, ks, strict=True)]
        lengths = [r.accept_history[-1] for r in batch]
        self._chooser.record(batch, ks, lengths, (seconds, mean_width, drafting))
        self.stats.add_tokens(self.now_s, sum(emitted))
        self.stats.add_step(self.now_s, ks)
        self._retire([r for r in batch if r.remaining <= 0])

    def _retire(self, finished: list[SimRequest]) -> None:
        if not finished:
            return
        done = {id(r) for r in finished}
        self._running = [r for r in self._running if id(r) not in done]
        phase_now = self.stats.phase_index(self.now_s)
        for request in finished:
            request.finish_s = self.now_s
            assert request.first_token_s is not None, "finished before its first token"
            generated = max(1, request.spec.num_output_tokens - 1)
            self.stats.add_finish(self.now_s, (self.now_s - request.first_token_s) / generated)
            concurrency = self._scenario.phases[phase_now].concurrency
            if request.client < concurrency and self.now_s < self.stats.duration_s:
                self._submit(phase_now, request.client, self.now_s)


def batch_shape(spec_tokens: Sequence[int], cost: Costs) -> tuple[float, float]:
    """(verify tokens per row, share of rows that run the draft) for one decode step."""
    widths = [padded_width(k, cost.verify_width_multiple) for k in spec_tokens]
    drafting = sum(1 for k in spec_tokens if k > 0) / len(spec_tokens)
    if cost.batch_verify == "padded":
        return float(max(widths)), 1.0 if drafting else 0.0
    return sum(widths) / len(widths), drafting
