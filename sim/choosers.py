"""The policies a simulation compares, each behind one small interface: a k chooser.

Each chooser picks k for every request of a decode step. ``no-spec`` and ``static-k<N>``
are constants, ``goodput`` is the real ``policies.goodput.GoodputPolicy`` fed by the real
``OnlineModels`` (the same objects the daemon uses; on a padded engine the embedded engine's
per-step planner, ``policies.batch_width.BatchWidth``, picks one k for the batch, asked row by
row as the engine asks), and ``oracle`` reads each request's acceptance trace ahead of time
and picks the best set of k for the step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

from policies.baselines.base import StepPolicy
from policies.batch_width import BatchWidth
from policies.costmodel import CostModel, CostTable, padded_width
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec
from policies.observation import step_observation
from policies.online import OnlineModels
from policies.schedule import best_shared_k
from policies.types import Observation, StepRow, Task, max_spec_tokens
from sim.request import SimRequest


class KChooser(Protocol):
    """Picks k (spec tokens) for every request of a simulated decode step."""

    name: str

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]: ...

    def record(
        self,
        batch: Sequence[SimRequest],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
        step: tuple[float, float, float],
    ) -> None:
        """After a step: what each request got; ``step`` = (seconds, mean width, drafting)."""


class FixedK:
    """no-spec (k = 0) or static-k<N>: the same k for every request and step."""

    def __init__(self, spec_tokens: int):
        self.spec_tokens = spec_tokens
        self.name = "no-spec" if spec_tokens == 0 else f"static-k{spec_tokens}"

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        return [self.spec_tokens] * len(batch)

    def record(self, *_: Any) -> None:
        return None


class GoodputChooser:
    """GoodputPolicy + OnlineModels, wired the way the embedded engine adapter wires them."""

    name = "goodput"

    def __init__(
        self,
        spec: GoodputSpec,
        table: CostTable,
        block_size: int,
        seed: int,
        min_k: int,
        padded: bool = False,
        models: OnlineModels | None = None,
        engine_multiple: int | None = None,
    ):
        self._policy = GoodputPolicy(spec)
        # ``models``: shared with another chooser of the same policy (goodput-auto's modes);
        # ``engine_multiple``: the engine's verify width multiple, which the embedded engine
        # hands its policy with its table (1 when rows verify at their own widths)
        self._models = models or OnlineModels(spec, block_size, table, engine_multiple)
        self._block_size = block_size
        self._rng = random.Random(f"goodput:{seed}")
        # the raw steps a request's window may span (``acceptance.request_window``)
        self._window = spec.request_window_steps * spec.request_plain_entry_steps
        self.min_spec_tokens = min_k
        # Padded engine: one k per step for the batch, as the embedded engine chooses it
        # (policies.batch_width.BatchWidth, one call per step with every row).
        self._width = (
            BatchWidth(spec, block_size, min_k, rng_u=self._rng.random) if padded else None
        )

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        if self._width is not None:
            ceiling = max_spec_tokens(self._block_size)  # the simulator does not clamp k
            rows = [
                StepRow(r.spec.key, r.spec.task, r.accept_history, r.k_history, ceiling)
                for r in batch
            ]
            rooms = [r.remaining for r in batch] if self._width.reads_rooms else None
            return [self._width.decide(rows, self._models.observe, rooms)] * len(batch)
        return [self._policy.decide(o).spec_tokens for o in self._observations(batch, now_s)]

    def task_of(self, request: SimRequest) -> Task:
        """The task the policy is told (the true one here; a classifier's in a subclass)."""
        return request.spec.task

    def fields_of(
        self, request: SimRequest, observed: dict[Task, dict[str, Any]]
    ) -> dict[str, Any]:
        """The online models' observation fields for the request's told task; ``observed``
        caches each task's fields for one step."""
        return self.observed(self.task_of(request), observed)

    def observed(self, task: Task, observed: dict[Task, dict[str, Any]]) -> dict[str, Any]:
        if task not in observed:
            observed[task] = self._models.observe(task)
        return observed[task]

    def _observations(self, batch: Sequence[SimRequest], now_s: float) -> list[Observation]:
        observed: dict[Task, dict[str, Any]] = {}
        out = []
        for request in batch:
            observation = step_observation(
                task=self.task_of(request),
                confidence=1.0,
                batch_size=len(batch),
                bounds=(self.min_spec_tokens, max_spec_tokens(self._block_size)),
                block_size=self._block_size,
                learned=self.fields_of(request, observed),
                accept_lengths=request.accept_history[-self._window :],
                spec_tokens=request.k_history[-self._window :],
                step_index=request.num_steps,
                now_s=now_s,
                rng_u=self._rng.random(),
            )
            out.append(observation)
        return out

    def record(
        self,
        batch: Sequence[SimRequest],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
        step: tuple[float, float, float],
    ) -> None:
        tasks = [self.task_of(r) for r in batch]
        record_online(self._models, tasks, spec_tokens, accept_lengths, step)


def record_online(
    models: OnlineModels,
    tasks: Sequence[Task],
    spec_tokens: Sequence[int],
    accept_lengths: Sequence[int],
    step: tuple[float, float, float],
) -> None:
    """A simulated step into the online models, as the embedded engine records it (each row
    under the task its policy saw)."""
    for task, k, length in zip(tasks, spec_tokens, accept_lengths, strict=True):
        models.record_step(task, k, length)
    seconds, mean_width, drafting = step
    models.record_step_time(len(tasks), mean_width, drafting, seconds)


class Informed:
    """Knows each request's per-position rates, not which step will accept what.

    Parametric traces: the rates the trace was drawn from, the best any non-clairvoyant policy
    could estimate. Recorded traces: the request's own rates over its whole recording (a
    hindsight average, constant over the request, so it cannot follow easy and hard runs).
    The goodput policy's decision rule on those rates, with no probing and no hysteresis:
    separates request-level estimation error from the oracle's per-step clairvoyance.
    """

    name = "informed"

    def __init__(
        self,
        spec: GoodputSpec,
        table: CostTable,
        block_size: int,
        min_k: int,
        padded: bool = False,
        engine_multiple: int | None = None,
    ):
        quiet = spec.model_copy(update={"probe_probability": 0.0, "hysteresis": 0.0})
        self._policy = GoodputPolicy(quiet)
        self._cost = OnlineModels(quiet, block_size, table, engine_multiple).step_cost()
        self._block_size = block_size
        self._min_k = min_k
        self._padded = padded  # one k for the batch: best_shared_k on the rows' rates

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        if self._padded:
            assert self._cost is not None, "built with a table, so it has a cost"
            rows = [true_rates(r) for r in batch]
            k = best_shared_k(rows, self._cost, self._min_k, max_spec_tokens(self._block_size))
            return [k] * len(batch)
        out = []
        for request in batch:
            rates = true_rates(request)
            observation = step_observation(
                task=request.spec.task,
                confidence=1.0,
                batch_size=len(batch),
                bounds=(self._min_k, max_spec_tokens(self._block_size)),
                block_size=self._block_size,
                learned={"accept_rates": rates, "step_cost": self._cost},
                accept_lengths=(),
                spec_tokens=(),
                step_index=0,
                now_s=0.0,
                rng_u=1.0,
            )
            out.append(self._policy.decide(observation).spec_tokens)
        return out

    def record(self, *_: Any) -> None:
        return None


def true_rates(request: SimRequest) -> tuple[float, ...]:
    rates = request.spec.trace.true_rates
    if rates is None:
        raise ValueError("the informed policy needs per-request rates on every trace")
    return tuple(rates)


class Oracle:
    """Knows every request's accepted length before the step; maximises the step's tokens/s.

    Per request the only sensible choices are k = 0 or the smallest allowed k that covers the
    accepted run; requests are added best gain-per-width first and the best prefix is kept.
    """

    name = "oracle"

    def __init__(
        self, cost: CostModel, block_size: int, min_spec_tokens: int, padded: bool = False
    ):
        self._cost = cost
        self._max_k = max_spec_tokens(block_size)
        self._min_k = min(min_spec_tokens, self._max_k)
        self._padded = padded

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        if self._padded:
            return self._choose_padded(batch)
        size = len(batch)
        options = []
        for index, request in enumerate(batch):
            run = min(request.peek_accepted(self._max_k), request.remaining - 1)
            if run > 0:
                k = max(self._min_k, run)
                extra = padded_width(k, self._cost.verify_width_multiple) - 1
                options.append((run / extra, index, k, run, extra))
        options.sort(reverse=True)
        best_m, best_rate = 0, size / self._cost.base_step_time_s(size, 1.0, 0.0)
        tokens, width = float(size), float(size)
        for m, (_, _, _, run, extra) in enumerate(options, start=1):
            tokens += run
            width += extra
            seconds = self._cost.base_step_time_s(size, width / size, m / size)
            if tokens / seconds > best_rate:
                best_m, best_rate = m, tokens / seconds
        ks = [0] * size
        for _, index, k, _, _ in options[:best_m]:
            ks[index] = k
        return ks

    def _choose_padded(self, batch: Sequence[SimRequest]) -> list[int]:
        """Every row pays the widest row's width and the draft: per step, the one k (no
        drafting, or the largest k of each captured width) that emits the most tokens per
        second given every row's known run. Exact per step; greedy over steps."""
        size = len(batch)
        runs = [max(0, min(r.peek_accepted(self._max_k), r.remaining - 1)) for r in batch]
        best_k, best = 0, size / self._cost.base_step_time_s(size, 1.0, 0.0)
        multiple = self._cost.verify_width_multiple
        candidates = {
            min(self._max_k, padded_width(k, multiple) - 1)
            for k in range(self._min_k, self._max_k + 1)
        }
        for k in sorted(candidates):
            width = float(padded_width(k, multiple))
            tokens = size + sum(min(run, k) for run in runs)
            rate = tokens / self._cost.base_step_time_s(size, width, 1.0)
            if rate > best:
                best_k, best = k, rate
        return [best_k] * size

    def record(self, *_: Any) -> None:
        return None


class StepChooser:
    """A ``policies.baselines`` step policy (fixed k, a batch-size schedule, vLLM's adaptive
    verification) as an engine runs it: one k for the whole batch, from the step's rows."""

    def __init__(self, policy: StepPolicy, block_size: int):
        self.policy = policy
        self.name = policy.name
        self._ceiling = max_spec_tokens(block_size)  # the simulator does not clamp k

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        rows = [
            StepRow(r.spec.key, r.spec.task, r.accept_history, r.k_history, self._ceiling)
            for r in batch
        ]
        return [self.policy.decide_step(rows, len(rows)).spec_tokens] * len(batch)

    def record(self, *_: Any) -> None:
        return None  # a step policy learns from the rows' histories at its next step
