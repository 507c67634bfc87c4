"""A closed-loop load on one simulated engine instance running one k chooser.

Recipe per iteration: phase changes (clients join) -> one step of the instance (prefill or
decode, ``sim/instance.py``); a finished request frees its client, which sends its next
request. Closed loop: a phase with concurrency N keeps N clients busy.
"""

from __future__ import annotations

from collections.abc import Callable

from policies.costmodel import CostModel
from sim.choosers import KChooser
from sim.instance import Instance
from sim.request import SimRequest
from sim.scenario import Scenario
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
        self._progress = progress
        self.stats = RunStats([(p.name, p.duration_s) for p in scenario.phases], scenario.bin_s)
        self.instance = Instance(
            scenario.max_batch_size, scenario.cost, chooser, cost, self.stats, self._finished
        )
        self._counters: dict[tuple[int, int], int] = {}
        self._phase = -1

    @property
    def now_s(self) -> float:
        return self.instance.now_s

    def run(self) -> RunStats:
        end = self.stats.duration_s
        reported = 0.0
        while self.now_s < end:
            self.enter_phases()
            if not self.instance.is_busy:
                self.instance.now_s = self._next_phase_start()
            else:
                self.instance.step()
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

    def enter_phases(self) -> None:
        """Start every phase whose time has come: its clients that are not busy send."""
        phases = self._scenario.phases
        while self._phase + 1 < len(phases) and self.now_s >= self.stats.phase_start(
            self._phase + 1
        ):
            self._phase += 1
            start = self.stats.phase_start(self._phase)
            queued = self.instance.running + list(self.instance.waiting)
            busy = {r.client for r in queued}
            for client in range(phases[self._phase].concurrency):
                if client not in busy:
                    self._submit(self._phase, client, start)

    def _submit(self, phase: int, client: int, arrival_s: float) -> None:
        index = self._counters.get((phase, client), 0)
        self._counters[(phase, client)] = index + 1
        spec = self._workload.request(phase, client, index)
        self.instance.submit(SimRequest(spec=spec, client=client, arrival_s=arrival_s))

    def _finished(self, request: SimRequest, now_s: float) -> None:
        phase_now = self.stats.phase_index(now_s)
        concurrency = self._scenario.phases[phase_now].concurrency
        if request.client < concurrency and now_s < self.stats.duration_s:
            self._submit(phase_now, request.client, now_s)
