"""One k per engine step for a batch that shares its verify width (padded engines).

draftctl's embedded engine verifies every row of a step at the widest row's width (padded to
a captured width) and runs the draft for every row once any row drafts. There a row's k = 0
or small k saves nothing while another row drafts wide: the decision that matters is the
batch's. ``BatchWidth`` makes it once per step and answers every row with it:

- the engine asks each row in turn (``spec_tokens``, one call per row per step). The first call
  of a step (a row asked twice, or as many calls as the batch has rows) decides the step's k
  from the rows of the previous step; every other call is a lookup plus O(positions) work for
  that row;
- each row keeps its last ``request_window_steps`` steps as counts (accepted-up-to and
  rejected-at, per position), updated in O(1) when it is asked. At the step's first call
  every previous-step row's expected accept length ``E_r(k)`` is its task's current rates
  blended with those counts exactly as ``blend_request_history`` does (no recency
  weighting), summed over rows in one vectorised pass (numpy from 6 rows on);
- the step's k maximises ``sum_r E_r(k) / T(B, k)`` (the sum scaled to B rows) over
  ``{0} U [min_k, max_k]``: drafting must beat a plain step by ``min_gain``, the previous
  step's k is kept unless another is better by ``hysteresis``, and with probability
  ``probe_probability`` the step verifies one captured width wider while those positions
  have fewer than ``probe_min_trials`` trials for a task in the batch (censoring);
- every row then verifies that k (the engine clamps it to what the row can still emit): on a
  padded engine a smaller k would only verify fewer of the tokens the step pays for.

Not thread-safe: one instance per engine, called on that engine's thread. Task rates and the
step cost come from ``learned(task)`` (``OnlineModels.observe``), read once per step per task.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policies.acceptance import expected_by_k, trials_from_step
from policies.costmodel import RelativeCost, padded_width
from policies.model import GoodputSpec
from policies.types import StepCost, Task

Learned = Callable[[Task], Mapping[str, Any]]


@dataclass
class RowWindow:
    """One request's recent steps as per-position counts (O(1) update, exact window)."""

    size: int
    positions: int
    steps: deque[tuple[int, bool]] = field(default_factory=deque)
    reached: list[int] = field(default_factory=list)  # steps that accepted exactly a drafts
    failed: list[int] = field(default_factory=list)  # ... of those, rejected at a + 1
    seen: int = 0  # accept lengths consumed from the engine's history

    def __post_init__(self) -> None:
        self.reached = [0] * (self.positions + 1)
        self.failed = [0] * (self.positions + 1)

    def add(self, spec_tokens: int, accept_length: int) -> None:
        if spec_tokens <= 0:
            return
        accepted, rejected = trials_from_step(min(spec_tokens, self.positions), accept_length)
        self.steps.append((accepted, rejected))
        self.reached[accepted] += 1
        self.failed[accepted] += rejected
        if len(self.steps) > self.size:
            old, was_rejected = self.steps.popleft()
            self.reached[old] -= 1
            self.failed[old] -= was_rejected

    def expected(self, task_rates: Sequence[float], strength: float) -> list[float]:
        """E(k) for k = 0..positions from the task rates blended with this window."""
        n = self.positions
        rates = [0.0] * n
        beyond = 0.0
        reached, failed = self.reached, self.failed
        for i in range(n - 1, -1, -1):
            beyond += reached[i + 1]
            rates[i] = (beyond + strength * task_rates[i]) / (beyond + failed[i] + strength)
        return expected_by_k(rates)


@dataclass
class _Row:
    task: Task
    window: RowWindow
    last_k: int = 0


# Below this many rows the per-row Python loop beats numpy's fixed cost.
_VECTOR_ROWS = 6


class BatchWidth:
    """The shared k of each engine step (see the module docstring)."""

    def __init__(
        self,
        spec: GoodputSpec,
        block_size: int,
        min_spec_tokens: int,
        max_spec_tokens: int | None = None,
        rng_u: Callable[[], float] | None = None,
    ):
        self._spec = spec
        self._positions = max(1, block_size - 1)
        self._max_k = min(max_spec_tokens or self._positions, self._positions)
        self._min_k = min(min_spec_tokens, self._max_k)
        self._rng_u = rng_u or (lambda: 1.0)
        self._fallback_cost = RelativeCost(spec.verify_width_multiple)
        self._rows: dict[Hashable, _Row] = {}  # rows of the previous step
        self._asked: dict[Hashable, _Row] = {}  # rows asked in this step
        self._calls_left = 0
        self.spec_tokens_now = 0
        self.steps = 0
        self._last: tuple[str, int, int, float] = ("none", 0, 0, 1.0)
        # Steps of one padded width cost the same: only the largest k of each can win.
        multiple = spec.verify_width_multiple
        self._candidates = sorted(
            {
                min(self._max_k, padded_width(k, multiple) - 1)
                for k in range(self._min_k, self._max_k + 1)
            }
        )

    def spec_tokens(
        self,
        row_id: Hashable,
        task: Task,
        batch_size: int,
        accept_lengths: Sequence[int],
        learned: Learned,
    ) -> int:
        """k for this row in the current step (the step's shared k)."""
        if self._calls_left <= 0 or row_id in self._asked:
            self._start_step(task, batch_size, learned)
        self._calls_left -= 1
        row = self._rows.pop(row_id, None)
        if row is None:
            row = _Row(task, RowWindow(self._spec.request_window_steps, self._positions))
        self._asked[row_id] = row
        window = row.window
        while window.seen < len(accept_lengths):  # the steps since this row was last asked
            window.add(row.last_k, accept_lengths[window.seen])
            window.seen += 1
        row.last_k = self.spec_tokens_now
        return self.spec_tokens_now

    def _start_step(self, task: Task, batch_size: int, learned: Learned) -> None:
        self._rows, self._asked = self._asked, {}
        rows = list(self._rows.values())
        if not rows:  # nothing known about the batch yet: the asking row's task
            rows = [_Row(task, RowWindow(1, self._positions))]
        rates: dict[Task, list[float]] = {}
        trials: dict[Task, tuple[float, ...]] = {}
        cost: StepCost | None = None
        for each in {row.task for row in rows}:
            fields = learned(each)
            rates[each] = self._fill(each, fields.get("accept_rates", ()))
            trials[each] = tuple(fields.get("accept_trials", ()))
            cost = cost or fields.get("step_cost")
        total = self._expected_sum(rows, rates)
        batch = max(1, batch_size)
        self._calls_left = batch
        k = self._choose(total, len(rows), batch, cost or self._fallback_cost, trials)
        self.spec_tokens_now = k
        self.steps += 1

    def _expected_sum(
        self, rows: Sequence[_Row], rates: Mapping[Task, Sequence[float]]
    ) -> list[float]:
        """sum over rows of E_r(k), k = 0..positions; E_r from the task rates + its window."""
        strength = self._spec.request_prior_strength
        if len(rows) < _VECTOR_ROWS:
            total = [0.0] * (self._positions + 1)
            for row in rows:
                for i, value in enumerate(row.window.expected(rates[row.task], strength)):
                    total[i] += value
            return total
        n = self._positions
        reached = np.array([row.window.reached for row in rows], dtype=np.float64)
        failed = np.array([row.window.failed for row in rows], dtype=np.float64)[:, :n]
        order = list(rates)
        prior = np.array([rates[t] for t in order], dtype=np.float64)
        prior = prior[[order.index(row.task) for row in rows]]
        # beyond[:, i]: steps that accepted more than i drafts (successes at position i + 1)
        beyond = np.cumsum(reached[:, :0:-1], axis=1)[:, ::-1]
        blended = (beyond + strength * prior) / (beyond + failed + strength)
        survive = np.cumprod(blended, axis=1).sum(axis=0)
        return [float(len(rows)), *(len(rows) + np.cumsum(survive)).tolist()]

    def _fill(self, task: Task, rates: Sequence[float]) -> list[float]:
        out = list(rates[: self._positions])
        if len(out) < self._positions:
            out += self._spec.prior_for(task, self._positions)[len(out) :]
        return out

    def _choose(
        self,
        total: Sequence[float],
        rows: int,
        batch: int,
        cost: StepCost,
        trials: Mapping[Task, tuple[float, ...]],
    ) -> int:
        spec = self._spec
        scale = batch / rows

        def score(k: int) -> float:
            return total[k] * scale / cost.step_time_s(batch, k)

        plain = score(0)
        best_k, best = 0, plain * (1.0 + spec.min_gain)
        for k in self._candidates:
            value = score(k)
            if value > best:
                best_k, best = k, value
        why = "best"
        previous = self.spec_tokens_now
        valid = previous == 0 or self._min_k <= previous <= self._max_k
        if self.steps and valid and previous != best_k:
            if score(previous) * (1.0 + spec.hysteresis) >= score(best_k):
                best_k, why = previous, "hold"
        probe = self._probe(best_k, trials)
        if probe is not None:
            best_k, why = probe, "probe"
        self._last = (why, batch, best_k, score(best_k) / plain)
        return best_k

    @property
    def reason(self) -> str:
        """Why the last step's k, e.g. ``batch[best] B=64 k=15 1.31x plain``."""
        why, batch, k, gain = self._last
        return f"batch[{why}] B={batch} k={k} {gain:.2f}x plain"

    def _probe(self, spec_tokens: int, trials: Mapping[Task, tuple[float, ...]]) -> int | None:
        spec = self._spec
        if spec_tokens >= self._max_k or self._rng_u() >= spec.probe_probability:
            return None
        multiple = spec.verify_width_multiple
        wider = self._min_k if spec_tokens == 0 else spec_tokens + multiple
        target = min(self._max_k, padded_width(wider, multiple) - 1)
        if target <= spec_tokens:
            return None
        for counts in trials.values():
            unseen = counts[spec_tokens:target]
            if not unseen or min(unseen) < spec.probe_min_trials:
                return target
        return None
