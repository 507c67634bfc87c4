"""Per-step k for the embedded engine and the OpenAI text assembly it relies on."""

from __future__ import annotations

import time

from controller.metrics import Metrics
from controller.policy_state import RunningPolicy
from controller.stats import LiveStats
from controller.step_control import StepDecider
from engines.embedded.events import RequestView
from engines.openai_format import Detokenizer
from policies.model import PolicySpec
from policies.types import Task


def _view(step: int, batch: int, history: list[int]) -> RequestView:
    return RequestView("r", step, history, batch, len(history))


def test_first_step_uses_gateway_k_then_policy_per_step() -> None:
    metrics = Metrics()
    decider = StepDecider(lambda: RunningPolicy.build(1, PolicySpec()), LiveStats(60, 0.0), metrics)
    steps = decider(Task.CHAT, 0.9, 4, 16)
    assert steps(_view(0, 1, [])) == 4
    assert steps(_view(1, 2, [3])) == 7  # chat, batch 2: band 1-8 -> k=7
    assert steps(_view(2, 70, [3, 1])) == 0  # chat above 64 in the batch: drafting off
    assert steps.spec_tokens == [4, 7, 0]


def test_failing_policy_step_is_k0_and_counted() -> None:
    class Broken:
        name = "broken"

        def decide(self, observation: object) -> object:
            raise ZeroDivisionError

    running = RunningPolicy(1, PolicySpec(), Broken())  # type: ignore[arg-type]
    metrics = Metrics()
    steps = StepDecider(lambda: running, LiveStats(60, time.monotonic()), metrics)(
        Task.MATH, 1.0, 15, 16
    )
    assert steps(_view(1, 1, [2])) == 0
    assert b'draftctl_degraded_decisions_total{component="policy"} 1.0' in metrics.render()


def test_detokenizer_holds_partial_utf8_and_cuts_at_stop() -> None:
    data = "héllo STOP more".encode()
    detok = Detokenizer(lambda ids: bytes(ids).decode(errors="replace"), ["STOP"])
    out = [detok.add([b], is_last=False) for b in data[:3]]
    assert out == ["h", "", "é"]  # the 2-byte é waits for its second byte
    rest = detok.add(list(data[3:]), is_last=False)
    assert detok.text == "héllo " and rest == "llo " and detok.is_stopped


def test_goodput_steps_use_the_online_models() -> None:
    running = RunningPolicy.build(1, PolicySpec(kind="goodput"), block_size=16)
    assert running.models is not None
    steps = StepDecider(lambda: running, LiveStats(60, 0.0), Metrics())(Task.MATH, 0.9, 7, 16)
    assert steps.accept_rates == running.models.observe(Task.MATH)["accept_rates"]
    k = steps(_view(1, 1, [8]))
    assert 0 <= k <= 15 and steps.spec_tokens == [k]


def test_goodput_rows_of_one_step_share_k_per_engine_thread() -> None:
    import threading

    from controller.step_control import _engine_planner

    running = RunningPolicy.build(7, PolicySpec(kind="goodput"), block_size=16)
    decider = StepDecider(lambda: running, LiveStats(60, 0.0), Metrics())
    rows = [decider(task, 0.9, 15, 16) for task in (Task.MATH, Task.CHAT, Task.CODE)]
    views = [RequestView(f"r{i}", 0, [], 3, 0) for i in range(3)]
    ks = [steps(view) for steps, view in zip(rows, views, strict=True)]
    assert len(set(ks)) == 1  # one k for the padded batch
    planner, _ = _engine_planner(running, 16)
    assert planner.steps == 1
    other: list[int] = []  # another engine thread has a planner of its own
    thread = threading.Thread(target=lambda: other.append(_engine_planner(running, 16)[0].steps))
    thread.start()
    thread.join()
    assert other == [0]


def test_goodput_planner_failure_is_k0_and_counted() -> None:
    running = RunningPolicy.build(8, PolicySpec(kind="goodput"), block_size=16)
    assert running.models is not None

    def broken(task: Task) -> dict[str, object]:
        raise RuntimeError("no estimates")

    metrics = Metrics()
    steps = StepDecider(lambda: running, LiveStats(60, 0.0), metrics)(Task.MATH, 1.0, 7, 16)
    running.models.observe = broken  # type: ignore[method-assign]  # fails from the next step
    assert steps(RequestView("x", 0, [], 1, 0)) == 0
    assert b'draftctl_degraded_decisions_total{component="policy"} 1.0' in metrics.render()
