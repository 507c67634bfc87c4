"""StepController: the embedded engine's spec_controller wired to the goodput policy."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from policies.costmodel import CostTable
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec
from policies.online import OnlineModels
from policies.step_controller import StepController
from policies.types import Task

TABLE = CostTable(
    batch_sizes=(1, 8, 64),
    tokens_per_request=(1, 8, 16),
    step_time_s=((5.5e-3, 6.0e-3, 6.5e-3), (5.8e-3, 7.4e-3, 9.2e-3), (7.8e-3, 26.8e-3, 39e-3)),
)


@dataclass
class View:
    step_index: int
    accept_lengths: list[int]
    batch_size: int
    context: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    spec_tokens: int
    accept_length: int


def test_learns_from_reports_and_keeps_k_history_in_the_context() -> None:
    spec = GoodputSpec(probe_probability=0.0, request_probe_steps=0, warmup_steps=0)
    models = OnlineModels(spec, block_size=16, cost_table=TABLE)
    controller = StepController(lambda: GoodputPolicy(spec), models, 16, rng=random.Random(1))
    context: dict[str, Any] = {"task": "chat"}
    # Chat at batch 8 with the prior: drafting pays.
    first = controller(View(0, [], 8, context))
    assert first > 0 and context["k_history"] == [first]
    # The fleet reports chat drafts that are always rejected at once: drafting stops.
    for _ in range(400):
        controller.record(Task.CHAT, Report(spec_tokens=15, accept_length=1))
    assert controller(View(1, [1], 8, {"task": "chat"})) == 0
    # Math is unaffected.
    assert controller(View(0, [], 8, {"task": "math"})) == 15
