"""A closed-loop load on one simulated engine instance running one k chooser: the fleet loop
(``sim/fleet.py``) with a single instance, so that one server and a fleet of one are the same
simulation."""

from __future__ import annotations

from policies.costmodel import CostModel
from sim.choosers import KChooser
from sim.fleet import FleetServer, Progress
from sim.instance import Instance
from sim.router import LeastLoaded
from sim.scenario import Scenario
from sim.workload import Workload

__all__ = ["Progress", "SimServer"]


class SimServer(FleetServer):
    def __init__(
        self,
        scenario: Scenario,
        workload: Workload,
        chooser: KChooser,
        cost: CostModel,
        progress: Progress | None = None,
    ):
        super().__init__(scenario, workload, [chooser], cost, LeastLoaded(), progress)

    @property
    def instance(self) -> Instance:
        return self.instances[0]
