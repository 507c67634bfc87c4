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
SPEC = GoodputSpec(probe_probability=0.0, request_probe_steps=0, warmup_steps=0)


@dataclass
class View:
    request_id: str
    step_index: int
    accept_lengths: list[int]
    batch_size: int
    context: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    spec_tokens: int
    accept_length: int


def _controller(shared: bool) -> StepController:
    models = OnlineModels(SPEC, block_size=16, cost_table=TABLE)
    return StepController(
        lambda: GoodputPolicy(SPEC), models, 16, rng=random.Random(1), shared=shared
    )


def test_per_request_learns_from_reports_and_keeps_k_history_in_the_context() -> None:
    controller = _controller(shared=False)
    context: dict[str, Any] = {"task": "chat"}
    # Chat at batch 8 with the prior: drafting pays.
    first = controller(View("a", 0, [], 8, context))
    assert first > 0 and context["k_history"] == [first]
    # The fleet reports chat drafts that are always rejected at once: drafting stops.
    for _ in range(400):
        controller.record(Task.CHAT, Report(spec_tokens=15, accept_length=1))
    assert controller(View("b", 1, [1], 8, {"task": "chat"})) == 0
    # Math is unaffected.
    assert controller(View("c", 0, [], 8, {"task": "math"})) == 15
    assert controller.calls == 3 and controller.host_s > 0


def test_shared_gives_every_row_of_a_step_the_same_k_and_learns() -> None:
    controller = _controller(shared=True)
    contexts = [{"task": t} for t in ("chat", "math", "chat")]
    ks = [controller(View(str(i), 0, [], 3, c)) for i, c in enumerate(contexts)]
    assert ks[0] > 0 and len(set(ks)) == 1  # one decision for the step
    assert [c["k_history"] for c in contexts] == [[ks[0]]] * 3
    assert controller.batch_width is not None and controller.batch_width.steps == 1
    for _ in range(400):  # every chat and math draft is rejected at once
        controller.record(Task.CHAT, Report(spec_tokens=15, accept_length=1))
        controller.record(Task.MATH, Report(spec_tokens=15, accept_length=1))
    ks = [controller(View(str(i), 1, [1], 3, c)) for i, c in enumerate(contexts)]
    assert ks == [0, 0, 0] and controller.batch_width.steps == 2
