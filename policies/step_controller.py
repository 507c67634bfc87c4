"""Per-step k for the embedded engine: a policy + OnlineModels behind ``spec_controller``.

The embedded engine calls ``spec_controller(view) -> k`` on its engine thread before every
step; step reports come back on the caller's event loop. ``StepController`` is that callable
and the matching ``record`` for reports, so an adapter wires the goodput policy in a few lines::

    controller = StepController(lambda: store.current.policy, models, block_size=16)
    context = {"task": task, "confidence": confidence}
    async for event in engine.generate(ids, params, controller, context):
        if event.report is not None:
            controller.record(task, event.report)

A lock guards ``models`` because the two calls run on different threads. Randomness comes from
the ``random.Random`` passed in; the policy itself stays pure.

``shared=True`` (the default; what the embedded engine needs, since it pads every row of a step
to the widest row's verify width and drafts for all rows once any drafts) chooses one k per
step for the whole batch with ``policies.batch_width.BatchWidth`` from the policy's settings
(``models.spec``); ``shared=False`` asks the policy per request (an engine that verifies each
row at its own width). ``host_s`` / ``calls`` count the time spent inside the controller.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from policies.batch_width import BatchWidth
from policies.online import OnlineModels
from policies.types import Observation, Policy, Task


class StepView(Protocol):
    """The fields of the embedded engine's ``RequestView`` this controller reads."""

    request_id: str
    step_index: int
    accept_lengths: list[int]
    batch_size: int
    context: dict[str, Any]


class StepReportView(Protocol):
    spec_tokens: int
    accept_length: int


class StepController:
    def __init__(
        self,
        policy: Callable[[], Policy],
        models: OnlineModels,
        block_size: int,
        min_spec_tokens: int = 4,
        window_steps: int = 32,
        rng: random.Random | None = None,
        shared: bool = True,
    ):
        self._policy = policy
        self._models = models
        self._block_size = block_size
        self._min_k = min(min_spec_tokens, block_size - 1)
        self._window = window_steps
        self._rng = rng or random.Random(0)
        self._lock = threading.Lock()
        self._width = (
            BatchWidth(models.spec, block_size, self._min_k, rng_u=self._rng.random)
            if shared
            else None
        )
        self.host_s = 0.0
        self.calls = 0

    @property
    def batch_width(self) -> BatchWidth | None:
        return self._width

    def __call__(self, view: StepView) -> int:
        """k for this request's next step; its k history lives in ``view.context``."""
        started = time.perf_counter()
        task = Task(view.context["task"])
        if self._width is not None:
            k = self._width.spec_tokens(
                view.request_id, task, view.batch_size, view.accept_lengths, self._observe
            )
            view.context.setdefault("k_history", []).append(k)
        else:
            k = self._per_request(view, task)
        self.host_s += time.perf_counter() - started
        self.calls += 1
        return k

    def _observe(self, task: Task) -> dict[str, Any]:
        with self._lock:
            return self._models.observe(task)

    def _per_request(self, view: StepView, task: Task) -> int:
        history: list[int] = view.context.setdefault("k_history", [])
        with self._lock:
            fields = self._models.observe(task)
            rng_u = self._rng.random()
        observation = Observation(
            task=task,
            confidence=float(view.context.get("confidence", 1.0)),
            concurrency=view.batch_size,
            min_spec_tokens=self._min_k,
            max_spec_tokens=self._block_size - 1,
            block_size=self._block_size,
            request_accept_lengths=_tail(view.accept_lengths, self._window),
            request_spec_tokens=_tail(history, self._window),
            previous_spec_tokens=history[-1] if history else None,
            step_index=view.step_index,
            rng_u=rng_u,
            **fields,
        )
        k = self._policy().decide(observation).spec_tokens
        history.append(k)
        return k

    def record(self, task: Task, report: StepReportView) -> None:
        """Feed one step report (k used, accept length) into the task's estimate."""
        with self._lock:
            self._models.record_step(task, report.spec_tokens, report.accept_length)


def _tail(values: Sequence[int], n: int) -> tuple[int, ...]:
    return tuple(values[-n:])
