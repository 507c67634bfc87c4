"""A load on a fleet of simulated engine instances behind a router.

Discrete events in time order: a phase starts (its idle clients send), a request arrives
(the router picks its instance from the instances' loads at that moment), or the busy
instance whose clock is earliest runs one step (``sim/instance.py``). Closed loop: a
finished request frees its client, whose next request arrives at that time. Open loop
(a phase's ``arrival_rate``): requests arrive at Poisson times drawn from the scenario's
seed and the phase alone, so every fleet gets the same arrivals however fast it serves them.
Instances step independently; a request arriving while an instance is mid-step waits for the
step to end, as on a server.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence

from policies.costmodel import CostModel
from sim.choosers import KChooser
from sim.instance import Instance
from sim.request import SimRequest
from sim.router import Router
from sim.scenario import Scenario
from sim.stats import RunStats
from sim.workload import Workload

Progress = Callable[[float], None]


class FleetServer:
    def __init__(
        self,
        scenario: Scenario,
        workload: Workload,
        choosers: Sequence[KChooser],
        cost: CostModel,
        router: Router,
        progress: Progress | None = None,
    ):
        self._scenario = scenario
        self._workload = workload
        self._router = router
        self._progress = progress
        self.stats = RunStats([(p.name, p.duration_s) for p in scenario.phases], scenario.bin_s)
        self.instances = [
            Instance(
                scenario.max_batch_size,
                getattr(c, "engine_costs", None) or scenario.cost,  # a ragged server's own
                c,
                cost,
                self.stats,
                self._finished,
            )
            for c in choosers
        ]
        self._arrivals: list[tuple[float, int, SimRequest]] = []  # heap by arrival time
        self._num_arrivals = 0
        self._busy_clients: set[int] = set()
        self._counters: dict[tuple[int, int], int] = {}
        self._phase = -1
        self._open: random.Random | None = None  # the open-loop phase's arrival times

    def run(self) -> RunStats:
        end = self.stats.duration_s
        reported = 0.0
        while True:
            busy = [inst for inst in self.instances if inst.is_busy]
            step_at = min((inst.now_s for inst in busy), default=end)
            arrival_at = self._arrivals[0][0] if self._arrivals else end
            phase_at = self._next_phase_start()
            now = min(step_at, arrival_at, phase_at)
            if now >= end:
                break
            if phase_at <= min(step_at, arrival_at):
                self._enter_phase()
            elif arrival_at <= step_at:
                request = heapq.heappop(self._arrivals)[2]
                self._route(request)
                if request.client < 0:
                    self._next_open(request)
            else:
                min(busy, key=lambda inst: inst.now_s).step()
            if self._progress is not None and now - reported >= 1.0:
                self._progress(now - reported)
                reported = now
        if self._progress is not None:
            self._progress(end - reported)
        for inst in self.instances:
            for request in [*inst.running, *inst.waiting]:
                if request.finish_s is None and request.arrival_s <= end:
                    self.stats.add_unfinished(request.arrival_s)
        return self.stats

    def _next_phase_start(self) -> float:
        if self._phase + 1 < len(self._scenario.phases):
            return self.stats.phase_start(self._phase + 1)
        return self.stats.duration_s

    def _enter_phase(self) -> None:
        self._phase += 1
        start = self.stats.phase_start(self._phase)
        phase = self._scenario.phases[self._phase]
        if phase.is_open:
            self._open = random.Random(f"{self._scenario.seed}:arrivals:{self._phase}")
            self._open_arrival(start, 0)
            return
        for client in range(phase.clients):
            if client not in self._busy_clients:
                self._arrive(self._phase, client, start)

    def _open_arrival(self, after_s: float, index: int) -> None:
        """The open-loop phase's next arrival after ``after_s``, if it falls inside the phase
        (requests ``(phase, index, 0)``; client ``-1 - index``, which no finish re-sends)."""
        rate = self._scenario.phases[self._phase].arrival_rate or 0.0
        if self._open is None or rate <= 0:
            return
        at = after_s + self._open.expovariate(rate)
        if at < self._next_phase_start():
            spec = self._workload.request(self._phase, index, 0)
            self._num_arrivals += 1
            request = SimRequest(spec=spec, client=-1 - index, arrival_s=at)
            heapq.heappush(self._arrivals, (at, self._num_arrivals, request))

    def _next_open(self, request: SimRequest) -> None:
        phase, index, _ = request.spec.key
        if phase == self._phase:
            self._open_arrival(request.arrival_s, index + 1)

    def _arrive(self, phase: int, client: int, arrival_s: float) -> None:
        index = self._counters.get((phase, client), 0)
        self._counters[(phase, client)] = index + 1
        spec = self._workload.request(phase, client, index)
        request = SimRequest(spec=spec, client=client, arrival_s=arrival_s)
        self._busy_clients.add(client)
        self._num_arrivals += 1
        heapq.heappush(self._arrivals, (arrival_s, self._num_arrivals, request))

    def _route(self, request: SimRequest) -> None:
        chosen = self._router.route(request.spec.task, self.instances)
        self.instances[chosen].submit(request)

    def _finished(self, request: SimRequest, now_s: float) -> None:
        self._busy_clients.discard(request.client)
        phase_now = self.stats.phase_index(now_s)
        clients = self._scenario.phases[phase_now].clients
        if 0 <= request.client < clients and now_s < self.stats.duration_s:
            self._arrive(phase_now, request.client, now_s)
