"""Live state behind ``/api/stats``, ``/metrics`` and the policy's observations.

Everything is windowed over ``stats.window_s`` except the plain request/error counters.
The gateway records what it decided and what each request reported; the scraper records
what each pool's ``/metrics`` said. Nothing here does I/O; the clock is passed in.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from controller.speedup import speedup_for_task, speedup_from_steps
from controller.windows import CountWindow, Window, quantile
from engines.base import Backend, Outcome, fixed_spec_tokens
from policies.types import TASKS, Task

_HISTORY_LEN = 600  # concurrency samples kept, one a second: ten minutes
_K_HISTORY_LEN = 300  # finished requests per task in the k-over-time chart
_MAX_TPOT_SAMPLES = 2000  # per (task, backend): bounds the cost of a quantile
_ESTIMATE_TTL_S = 0.5  # policy inputs are recomputed at most this often, not per request


def spec_counts(outcome: Outcome) -> list[int] | None:
    """[drafts, accepted tokens, accepted at position 0, 1, ...] or None if not reported."""
    if outcome.num_drafts is not None and outcome.num_accepted_tokens is not None:
        return [outcome.num_drafts, outcome.num_accepted_tokens, *outcome.accepted_per_position]
    if outcome.accept_lengths:
        return [len(outcome.accept_lengths), sum(a - 1 for a in outcome.accept_lengths)]
    return None


@dataclass
class ScrapedView:
    """What the latest scrape of one pool's ``/metrics`` says (windowed by the scraper)."""

    running: int | None = None
    waiting: int | None = None
    accept_length_mean: float | None = None
    accept_rate_per_position: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class TaskEstimates:
    """Windowed inputs to a policy decision for one task (cached for _ESTIMATE_TTL_S)."""

    computed_s: float
    accept_rates: tuple[float, ...]
    accept_trials: tuple[float, ...]
    pool_tpot_s: dict[str, float | None]
    pool_accept_length: dict[str, float | None]


@dataclass
class _Cell:
    """Per (task, backend) windows."""

    spec: CountWindow
    tpot: Window
    spec_step: Window  # embedded engine: step times of steps that drafted
    plain_step: Window  # embedded engine: step times of steps with k = 0


class LiveStats:
    def __init__(self, window_s: float, started_s: float) -> None:
        self.window_s = window_s
        self.started_s = started_s
        self._cells: dict[tuple[Task, str], _Cell] = {}
        self._task_requests: Counter[Task] = Counter()
        self._confidence_sum: dict[Task, float] = dict.fromkeys(TASKS, 0.0)
        self._chosen: dict[Task, Counter[int]] = {t: Counter() for t in TASKS}
        self._backend_requests: Counter[str] = Counter()
        self._backend_errors: Counter[str] = Counter()
        self.scraped: dict[str, ScrapedView] = {}
        self._classify = Window(window_s)
        self._history: deque[tuple[float, int]] = deque(maxlen=_HISTORY_LEN)
        self._estimates: dict[Task, TaskEstimates] = {}
        # Per task: the k its finished requests ran (wall time, mean k) and why the last one.
        self._k_history: dict[Task, deque[tuple[float, float]]] = {
            t: deque(maxlen=_K_HISTORY_LEN) for t in TASKS
        }
        self._k_reason: dict[Task, str | None] = dict.fromkeys(TASKS)

    def _cell(self, task: Task, backend: str) -> _Cell:
        key = (task, backend)
        if key not in self._cells:

            def samples() -> Window:
                return Window(self.window_s, max_samples=_MAX_TPOT_SAMPLES)

            self._cells[key] = _Cell(CountWindow(self.window_s), samples(), samples(), samples())
        return self._cells[key]

    def record_classify(self, now_s: float, latency_s: float) -> None:
        self._classify.record(now_s, latency_s)

    def record_decision(self, task: Task, confidence: float, backend: str, k: int) -> None:
        self._task_requests[task] += 1
        self._confidence_sum[task] += confidence
        self._chosen[task][k] += 1
        self._backend_requests[backend] += 1

    def record_k(self, wall_s: float, task: Task, spec_tokens: float, reason: str | None) -> None:
        """The k a finished request of ``task`` ran (its steps' mean on the embedded engine,
        the admitted k on a pool) and why, for the dashboard's k-over-time chart."""
        self._k_history[task].append((round(wall_s, 3), round(spec_tokens, 2)))
        self._k_reason[task] = reason

    def record_outcome(
        self, now_s: float, task: Task, backend: str, outcome: Outcome, tpot_s: float | None
    ) -> float | None:
        """Record one finished request; returns the (task, backend) windowed accept length."""
        cell = self._cell(task, backend)
        counts = spec_counts(outcome)
        if counts is not None:
            cell.spec.record(now_s, counts)
        if tpot_s is not None:
            cell.tpot.record(now_s, tpot_s)
        for step_s in outcome.step_times_s:
            cell.spec_step.record(now_s, step_s)
        for step_s in outcome.plain_step_times_s:
            cell.plain_step.record(now_s, step_s)
        return _accept_length(cell.spec.total(now_s))

    def record_error(self, backend: str) -> None:
        self._backend_errors[backend] += 1

    def sample_concurrency(self, now_s: float, wall_s: float, num_inflight: int) -> None:
        self._history.append((round(wall_s, 3), num_inflight))

    def _task_spec(self, task: Task, now_s: float) -> list[list[int]]:
        return [c.spec.total(now_s) for (t, _), c in self._cells.items() if t == task]

    def estimates(self, task: Task, now_s: float) -> TaskEstimates:
        """Policy inputs for ``task``; recomputed at most every _ESTIMATE_TTL_S seconds."""
        cached = self._estimates.get(task)
        if cached is not None and now_s - cached.computed_s < _ESTIMATE_TTL_S:
            return cached
        rates, trials = self.accept_rates(task, now_s)
        cells = {b: c for (t, b), c in self._cells.items() if t == task}
        fresh = TaskEstimates(
            now_s,
            rates,
            trials,
            {b: c.tpot.quantile(now_s, 0.5) for b, c in cells.items()},
            {b: _accept_length(c.spec.total(now_s)) for b, c in cells.items()},
        )
        self._estimates[task] = fresh
        return fresh

    def accept_rates(self, task: Task, now_s: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Conditional per-position acceptance for ``task`` and the trials behind each rate.

        Rate i = P(position i+1 accepted | positions 1..i accepted), pooled over backends
        that drafted position i+1 (see Observation.accept_rates / accept_trials).
        """
        per_backend = [c for c in self._task_spec(task, now_s) if len(c) > 2]
        width = max((len(c) - 2 for c in per_backend), default=0)
        rates: list[float] = []
        trials: list[float] = []
        for i in range(width):
            reached = sum(c[1 + i] if i else c[0] for c in per_backend if len(c) - 2 > i)
            accepted = sum(c[2 + i] for c in per_backend if len(c) - 2 > i)
            if reached <= 0:
                break
            rates.append(accepted / reached)
            trials.append(float(reached))
        return tuple(rates), tuple(trials)

    def task_accept_length(self, task: Task, now_s: float) -> float | None:
        totals = [c for c in self._task_spec(task, now_s) if c]
        return _accept_length([sum(c[0] for c in totals), sum(c[1] for c in totals)])

    def task_tpots(self, task: Task, now_s: float) -> dict[str, list[float]]:
        return {b: c.tpot.values(now_s) for (t, b), c in self._cells.items() if t == task}

    def snapshot(
        self, now_s: float, wall_s: float, backends: list[Backend], policy: dict[str, Any]
    ) -> dict[str, Any]:
        """The ``/api/stats`` document (schema: docs/gateway.md)."""
        return {
            "time_s": wall_s,
            "uptime_s": now_s - self.started_s,
            "policy": policy,
            "tasks": {t.value: self._task_view(t, now_s, backends) for t in TASKS},
            "backends": [self._backend_view(b, now_s) for b in backends],
            "concurrency": {
                "current": sum(b.num_inflight() for b in backends),
                "history": [list(p) for p in self._history],
            },
            "classifier": {
                "latency_p50_s": self._classify.quantile(now_s, 0.5),
                "latency_p99_s": self._classify.quantile(now_s, 0.99),
            },
        }

    def _task_view(self, task: Task, now_s: float, backends: list[Backend]) -> dict[str, Any]:
        n = self._task_requests[task]
        tpots = self.task_tpots(task, now_s)
        merged = [v for values in tpots.values() for v in values]
        k_by_backend = {b.name: fixed_spec_tokens(b) for b in backends}
        return {
            "requests": n,
            "classified_confidence_mean": self._confidence_sum[task] / n if n else None,
            "accept_length_mean": self.task_accept_length(task, now_s),
            "spec_tokens_chosen": {str(k): c for k, c in sorted(self._chosen[task].items())},
            "k_history": [list(point) for point in self._k_history[task]],
            "k_reason": self._k_reason[task],
            "tpot_p50_s": quantile(merged, 0.5),
            "tpot_p95_s": quantile(merged, 0.95),
            "speedup": self._speedup(task, now_s, tpots, k_by_backend),
        }

    def _speedup(
        self,
        task: Task,
        now_s: float,
        tpots: dict[str, list[float]],
        k_by_backend: dict[str, int | None],
    ) -> dict[str, Any]:
        cells = [c for (t, _), c in self._cells.items() if t == task]
        spec = [v for c in cells for v in c.spec_step.values(now_s)]
        # A plain step costs the same whatever the task: the baseline is every k = 0 step of
        # the engines this task ran on, so every task's card is computed the same way.
        engines = {b for (t, b) in self._cells if t == task}
        plain = [
            v
            for (_, b), c in self._cells.items()
            if b in engines
            for v in c.plain_step.values(now_s)
        ]
        accept = self.task_accept_length(task, now_s)
        if spec and plain and accept is not None:
            return speedup_from_steps(accept, plain, spec)
        concurrency = self._history[-1][1] if self._history else 1
        return speedup_for_task(tpots, k_by_backend, accept, concurrency)

    def _backend_view(self, backend: Backend, now_s: float) -> dict[str, Any]:
        mine = [c for (_, b), c in self._cells.items() if b == backend.name]
        spec = _sum_counts([c.spec.total(now_s) for c in mine])
        tpots = [v for c in mine for v in c.tpot.values(now_s)]
        scraped = self.scraped.get(backend.name, ScrapedView())
        own_rates = [a / spec[0] for a in spec[2:]] if spec and spec[0] else []
        return {
            "name": backend.name,
            "kind": backend.kind,
            "healthy": backend.is_healthy(),
            "inflight": backend.num_inflight(),
            "running": scraped.running,
            "waiting": scraped.waiting,
            "spec_tokens": fixed_spec_tokens(backend),
            "block_size": backend.block_size,
            "accept_length_mean": scraped.accept_length_mean or _accept_length(spec),
            "accept_rate_per_position": scraped.accept_rate_per_position or own_rates,
            "tpot_p50_s": quantile(tpots, 0.5),
            "requests": self._backend_requests[backend.name],
            "errors": self._backend_errors[backend.name],
        }


def _sum_counts(vectors: list[list[int]]) -> list[int]:
    width = max((len(v) for v in vectors), default=0)
    return [sum(v[i] for v in vectors if len(v) > i) for i in range(width)]


def _accept_length(counts: list[int]) -> float | None:
    if len(counts) < 2 or counts[0] <= 0:
        return None
    return 1.0 + counts[1] / counts[0]
