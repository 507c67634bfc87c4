"""What a fleet comparison maximises (``draftctl simulate`` with a fleet, ``draftctl plan``).

Closed-loop traffic (clients that wait for their answers): goodput, tokens per second — a
faster fleet serves more. Open-loop traffic (arrival rates): every fleet that keeps up serves
the same tokens, so the mean request latency (arrival to last token; a request unfinished at
the end counts up to it) decides, scored as its inverse so that higher is better everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from sim.scenario import Scenario

Objective = Literal["goodput", "latency"]
FIELDS: dict[Objective, str] = {"goodput": "goodput_tok_s", "latency": "latency_ms_mean"}


def objective_of(scenario: Scenario) -> Objective:
    return "latency" if scenario.phases[0].is_open else "goodput"


def score(entry: Mapping[str, Any], objective: Objective) -> float:
    """Higher is better: goodput, or 1000 / mean latency in ms (0 with no request)."""
    value = entry[FIELDS[objective]]
    if objective == "goodput":
        return float(value)
    return 1000.0 / float(value) if value else 0.0
