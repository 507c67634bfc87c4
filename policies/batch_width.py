"""One k per engine step for a batch that shares its verify width (padded engines).

draftctl's embedded engine verifies every row of a step at the widest row's width (padded to
a captured width) and runs the draft for every row once any row drafts. There a row's k = 0
or small k saves nothing while another row drafts wide: the decision that matters is the
batch's. ``BatchWidth.decide(rows, learned)`` makes it, once per engine step, from exactly the
rows of that step (``StepRow``: id, task, its accept lengths and the k each step ran with, its
ceiling now); the engine gives every row that k, clamped to the row's ceiling.

- Windows: each row keeps its last ``request_window_steps`` entries as per-position counts
  in one row of preallocated arrays, by slot (``RowWindows``): a drafted step is an entry,
  and so is every ``request_plain_entry_steps`` consecutive plain ones
  (``acceptance.request_window``). A step is recorded at the k it
  ran with, so a step the engine clamped near the request's end is no rejection at the
  planned k. A row missing from a step has left the batch and its slot is freed: a new
  request never inherits a finished one's window.
- Expected tokens: every row's ``E_r(k)`` is its task's current rates blended with its window
  exactly as ``blend_request_history`` blends them (no recency weighting), capped at the
  row's ceiling, in a few numpy passes over all rows; host time barely grows with the batch.
- The choice: k maximises ``sum_r E_r(k) / T(B, k)`` over 0 and the largest k of each captured
  width in ``[min_k, max_k]`` (k's of one padded width cost the same; T at the width the
  clamped rows really run). The widths are the step cost's: an engine whose rows verify at
  their own widths (ragged) hands its table with multiple 1, so every k in ``[min_k, max_k]``
  is a candidate at its own price (before session 38 the policy's multiple of 8 left only
  k = 7 and 15 there). Drafting must beat a plain step by ``min_gain``; the previous
  *decision* is kept unless another k is better by ``hysteresis``.
- Probes, and why they end: positions past the chosen k are censored, so with probability
  ``probe_probability`` a step verifies one captured width wider, but only while fewer than
  ``probe_min_steps`` of a batch task's recent steps (decayed like its estimates) drafted that
  width's positions (``acceptance.drafted_steps``: the trials there divided by the chance of
  reaching them). The earlier rule waited for ``probe_min_trials`` trials at every position;
  far positions of a 15-token block get a few trials per hundred drafted steps, so it never
  stopped. A probe is not a decision: the next step's hold reference is the decision before
  the probe. The earlier planner held the probed k whenever hysteresis exceeded the cost
  model's width premium (3% against 1.5% at batch 1 on the H200), so one probe to k = 15 was
  kept for good where k = 7 was faster.
- Drains (``drain_makespan``, off by default): once rows have left and none has joined for
  ``drain_quiet_decisions`` decisions, the rows still running are done when the one with the
  most steps left is, so k maximises ``1 / (T(B, k) x max_r room_r / E_r(k))`` (``room_r``:
  what the row may still emit, ``decide``'s ``remaining``) instead of the batch's tokens a
  second; ``min_gain`` and ``hysteresis`` apply to that score the same way.

Not thread-safe: one instance per engine, called on that engine's thread. Task rates and the
step cost come from ``learned(task)`` (``OnlineModels.observe``), read once per step per task.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from policies import types
from policies.acceptance import drafted_steps, request_window
from policies.costmodel import RelativeCost, padded_width
from policies.model import GoodputSpec
from policies.types import TASK_INDEX, TASKS, StepCost, StepRow, Task

Learned = Callable[[Task], Mapping[str, Any]]
_newest = operator.itemgetter(-1)
_fields = operator.attrgetter("row_id", "task", "accept_lengths", "spec_tokens", "max_spec_tokens")


class RowWindows:
    """Every row's steps of the last ``size`` engine steps, one array row per slot.

    ``counts[slot]`` is what the blend needs, per position i + 1: ``counts[slot, 0, i]``,
    window steps that accepted more than i drafts (successes), and ``counts[slot, 1, i]``,
    those that put the position at risk (successes, or the rejection that ended the step).
    The ring keeps each window entry's own two rows, subtracted again when the entry leaves;
    each row writes its own cells in turn: every drafted step, and a zero entry for every
    ``plain_per_entry`` consecutive steps with k = 0, so a window is the row's entries as
    ``acceptance.request_window`` reads them (``plain_per_entry`` 1: its last ``size`` steps).
    """

    def __init__(self, size: int, positions: int, capacity: int = 64, plain_per_entry: int = 1):
        self.size = size
        self.positions = positions
        self.plain_per_entry = plain_per_entry
        self._slot_of: dict[Hashable, int] = {}
        self._free: list[int] = []
        self._next = np.zeros(0, np.intp)  # per slot: the cell its next entry goes into
        self._idle = np.zeros(0, np.intp)  # per slot: plain steps since its last entry
        self.rows_per_task = [0] * len(TASKS)
        self.position = np.arange(positions)
        self.task = np.zeros(0, np.intp)
        self.counts = np.zeros((0, 2, positions))
        self._ring = np.zeros((0, size, 2, positions))  # [slot, window step, (s, t), position]
        self._seen = np.zeros(0, np.intp)  # history entries read
        # Per slot, what the last batch-wide decision expected a step of it to emit at each
        # k = 0..positions (NaN: no decision since the slot was opened), and the steps the
        # last ``ingest`` brought: (slots, k [rows, steps], accept length [rows, steps]).
        self.expected = np.zeros((0, positions + 1))
        self.decided = np.zeros(0, np.intp)  # the k that decision gave the slot (-1: none)
        # Rows the last ``ingest`` opened (joined the batch) and closed (left it).
        self.joined = 0
        self.left = 0
        self.last_new: tuple[np.ndarray, np.ndarray, np.ndarray] = (
            np.zeros(0, np.intp),
            np.zeros((0, 1), np.intp),
            np.ones((0, 1), np.intp),
        )
        # [accepted, rejected]: a step's (successes, trials) rows, trials_from_step's rule
        below = np.arange(positions + 2)[:, None] > self.position
        self._step_row = np.zeros((positions + 1, 2, 2, positions))
        self._step_row[:, :, 0] = below[:-1, None]
        self._step_row[:, 0, 1] = below[:-1]
        self._step_row[:, 1, 1] = below[1:]  # the rejected position is a trial too
        # Called with (slots, k [rows, steps], accept length [rows, steps], ran [rows, steps]
        # or None: every step) before the steps just read change the windows, so
        # ``counts[slots]`` is still what a decision for them saw (``StrengthChooser``).
        self.before_advance: Callable[..., None] | None = None
        self._grow(capacity)

    def __len__(self) -> int:
        return len(self._slot_of)

    def ingest(
        self,
        row_ids: Sequence[Hashable],
        tasks: Sequence[Task],
        accept_lengths: Sequence[Sequence[int]],
        spec_tokens: Sequence[Sequence[int]],
    ) -> np.ndarray:
        """The slots of the step's rows, in order, after writing each row's steps since it was
        last seen (``StepRow`` columns); rows absent from the step have left the batch and are
        forgotten. Per row only a dict lookup and reading the newest step run in Python."""
        slots = self._slots(row_ids, tasks)
        steps = list(map(len, accept_lengths))
        if list(map(len, spec_tokens)) != steps:
            i = next(i for i, ks in enumerate(spec_tokens) if len(ks) != steps[i])
            raise ValueError(
                f"row {row_ids[i]!r}: {len(spec_tokens[i])} spec_tokens for {steps[i]} "
                "accept_lengths (one k per step)"
            )
        count = len(slots)
        rows = np.fromiter(slots, np.intp, count)
        new = np.fromiter(steps, np.intp, count) - self._seen[rows]
        self._seen[rows] = steps
        if bool((new == 1).all()):  # the usual step: every row brings the step that just ran
            last_k = np.fromiter(map(_newest, spec_tokens), np.intp, count)
            last_length = np.fromiter(map(_newest, accept_lengths), np.intp, count)
            if self.before_advance is not None:
                self.before_advance(rows, last_k[:, None], last_length[:, None], None)
            self._advance(rows, last_k, last_length)
            self.last_new = (rows, last_k[:, None], last_length[:, None])
            return rows
        # Several engine steps since the last call (decisions spaced by the step controller),
        # or rows with none: one engine step at a time, oldest first; row i ran the step j
        # back when it brought at least j new steps (else it sits that step out).
        span = min(max(int(new.max()), 1), self.size)
        ks = np.zeros((count, span), np.intp)
        lengths = np.ones((count, span), np.intp)
        ran = np.zeros((count, span), bool)
        # Rows that bring a whole span of steps (the usual spaced call: all of them) in one
        # array each; rows that joined since, one by one.
        stayed = np.flatnonzero((new == span) & (new <= self.size)).tolist()
        if stayed:
            ks[stayed] = [spec_tokens[i][-span:] for i in stayed]
            lengths[stayed] = [accept_lengths[i][-span:] for i in stayed]
            ran[stayed] = True
        for i in np.flatnonzero((new >= 1) & (new < span)).tolist():
            n = int(new[i])
            ks[i, span - n :] = spec_tokens[i][-n:]
            lengths[i, span - n :] = accept_lengths[i][-n:]
            ran[i, span - n :] = True
        moved = np.flatnonzero(ran.any(axis=1))
        if moved.size:
            if self.before_advance is not None:
                self.before_advance(rows[moved], ks[moved], lengths[moved], ran[moved])
            self._advance_span(rows[moved], ks[moved], lengths[moved], ran[moved])
        for i in np.flatnonzero((new < 0) | (new > self.size)).tolist():
            self._catch_up(int(rows[i]), tasks[i], spec_tokens[i], accept_lengths[i], int(new[i]))
        self.last_new = (rows, ks, lengths)  # (caught-up rows: their expectation was reset)
        return rows

    def _slots(self, row_ids: Sequence[Hashable], tasks: Sequence[Task]) -> list[int]:
        """Each row's slot: rows that left are closed first, so new ones reuse their slots."""
        slot_of = self._slot_of
        gone = slot_of.keys() - set(row_ids)
        for row_id in gone:
            self._close(slot_of.pop(row_id))
        self.left = len(gone)
        slots = list(map(slot_of.get, row_ids))
        self.joined = 0
        if None in slots:
            for i in [i for i, slot in enumerate(slots) if slot is None]:
                slots[i] = slot_of[row_ids[i]] = self._open(tasks[i])
                self.joined += 1
        if len(slot_of) != len(row_ids):
            raise ValueError("a row id appears twice in one step")
        return slots  # type: ignore[return-value]  # no None left

    def _step_rows(self, spec_tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """[steps, 2, positions]: each step's successes and trials (``trials_from_step``)."""
        accepted = np.minimum(np.maximum(lengths, 1) - 1, np.minimum(spec_tokens, self.positions))
        return self._step_row[accepted, (accepted < spec_tokens).view(np.int8)]

    def _advance(self, slots: np.ndarray, spec_tokens: np.ndarray, lengths: np.ndarray) -> None:
        """One engine step of each of ``slots`` (distinct): a drafted step is an entry, and a
        plain one that completes ``plain_per_entry`` in a row a zero entry; each replaces its
        row's oldest. (``_advance_span`` for one step, in the few array operations the
        every-step path can afford.)"""
        drafted = spec_tokens > 0
        idle = np.where(drafted, 0, self._idle[slots] + 1)
        write = drafted | (idle >= self.plain_per_entry)
        idle[write] = 0
        self._idle[slots] = idle
        if not write.any():
            return
        at = slots[write]
        cells = self._next[at]
        steps = self._step_rows(spec_tokens[write], lengths[write])
        self.counts[at] += steps - self._ring[at, cells]
        self._ring[at, cells] = steps
        self._next[at] = (cells + 1) % self.size

    def _advance_span(
        self, slots: np.ndarray, spec_tokens: np.ndarray, lengths: np.ndarray, ran: np.ndarray
    ) -> None:
        """``_advance`` for several engine steps at once ([rows, steps] each, ``ran``: the
        steps each row was in), in arrays: a plain step is a zero entry where the plain steps
        since the row's last drafted one (or, before any in the span, since its last entry,
        ``_idle``) reach a multiple of ``plain_per_entry``."""
        per = self.plain_per_entry
        drafted = ran & (spec_tokens > 0)
        plain = ran & (spec_tokens <= 0)
        count = np.cumsum(plain, axis=1)
        steps = np.arange(spec_tokens.shape[1])
        last = np.maximum.accumulate(np.where(drafted, steps, -1), axis=1)
        since: np.ndarray = count - np.take_along_axis(count, np.maximum(last, 0), axis=1)
        idle = np.where(last >= 0, since, self._idle[slots][:, None] + count)
        write = drafted | (plain & (idle % per == 0))
        self._idle[slots] = idle[:, -1] % per
        if not write.any():
            return
        # each write's cell: the row's next, then on (a row writes at most ``size`` here)
        cells = (self._next[slots][:, None] + np.cumsum(write, axis=1) - 1) % self.size
        entries = self._step_rows(np.where(write, spec_tokens, 0), lengths)
        at = (slots[:, None], cells)
        gone = np.where(write[:, :, None, None], self._ring[at], 0.0)
        self.counts[slots] += (entries - gone).sum(axis=1)
        row, step = np.nonzero(write)
        self._ring[slots[row], cells[row, step]] = entries[row, step]
        self._next[slots] = (self._next[slots] + write.sum(axis=1)) % self.size

    def _catch_up(
        self, slot: int, task: Task, spec_tokens: Sequence[int], lengths: Sequence[int], new: int
    ) -> None:
        """Several new steps (a row first seen mid-request), or a history shorter than the one
        read before (the id of a finished request, reused): its window read afresh from its
        whole history (``acceptance.request_window``), oldest entry in the first cell."""
        self.rows_per_task[self.task[slot]] -= 1
        self._reset(slot, task)
        ks, kept = request_window(spec_tokens, lengths, self.size, self.plain_per_entry)
        plain = 0  # the plain steps since the row's last entry
        for k in reversed(spec_tokens[: len(lengths)]):
            if k > 0:
                break
            plain += 1
        self._idle[slot] = plain % self.plain_per_entry
        if not ks:
            return
        steps = self._step_rows(np.array(ks), np.array(kept))
        self._ring[slot, : len(ks)] = steps
        self.counts[slot] = steps.sum(axis=0)
        self._next[slot] = len(ks) % self.size

    def _open(self, task: Task) -> int:
        if not self._free:
            self._grow(2 * len(self._seen))
        slot = self._free.pop()
        self._reset(slot, task)
        self._seen[slot] = 0
        return slot

    def _reset(self, slot: int, task: Task) -> None:
        self.task[slot] = index = TASK_INDEX[task]
        self.rows_per_task[index] += 1
        self.counts[slot] = 0.0
        self._ring[slot] = 0.0
        self._next[slot] = 0
        self._idle[slot] = 0
        self.expected[slot] = np.nan
        self.decided[slot] = -1

    def _close(self, slot: int) -> None:
        self.rows_per_task[self.task[slot]] -= 1
        self._free.append(slot)

    def _grow(self, capacity: int) -> None:
        old = len(self._seen)
        extra = capacity - old
        self.task = np.concatenate([self.task, np.zeros(extra, np.intp)])
        self.counts = np.concatenate([self.counts, np.zeros((extra, *self.counts.shape[1:]))])
        self._ring = np.concatenate([self._ring, np.zeros((extra, *self._ring.shape[1:]))])
        self._seen = np.concatenate([self._seen, np.zeros(extra, np.intp)])
        self._next = np.concatenate([self._next, np.zeros(extra, np.intp)])
        self._idle = np.concatenate([self._idle, np.zeros(extra, np.intp)])
        unseen = np.full((extra, self.positions + 1), np.nan)
        self.expected = np.concatenate([self.expected, unseen])
        self.decided = np.concatenate([self.decided, np.full(extra, -1, np.intp)])
        self._free += range(capacity - 1, old - 1, -1)


class StrengthChooser:
    """Per task, the request strength (pseudo-steps of the task estimate in a row's blend)
    whose blends have predicted that task's drafted row-steps best.

    Each drafted row-step is scored before it enters its row's window: under every candidate
    strength S the blend ``(successes + S x rate) / (trials + S)`` of the window as the
    decision saw it gives the probability of the step's accepted run (every accepted position
    and, where the step was cut short, the rejected one), and the log of it is added to the
    task's sum for S; the sums forget with ``half_life`` scored steps. The task's strength is
    the candidate of the largest sum once it has ``min_steps`` scored steps, ``fixed`` before.
    A prequential choice (each step predicted before it is seen) of how much one request's
    past says about its next step: little where a task's requests are alike, much where they
    differ. Steps read several at once (spaced decisions) are scored against the window
    before the first of them.
    """

    def __init__(
        self,
        choices: Sequence[float],
        half_life: float,
        min_steps: float,
        fixed: float,
        prior_rates: np.ndarray,
    ):
        self.choices = np.asarray(choices, float)
        self._keep = 0.5 ** (1.0 / half_life)
        self._min_steps = min_steps
        self.loglik = np.zeros((len(TASKS), len(self.choices)))
        self.scored = np.zeros(len(TASKS))  # decayed count of scored steps per task
        self.strengths = np.full(len(TASKS), float(fixed))
        self.rates = prior_rates  # [tasks, positions]: the task rates decisions blend with

    def score(
        self,
        windows: RowWindows,
        slots: np.ndarray,
        spec_tokens: np.ndarray,
        lengths: np.ndarray,
        ran: np.ndarray | None,
    ) -> None:
        drafted = spec_tokens > 0 if ran is None else ran & (spec_tokens > 0)
        if not drafted.any():
            return
        row, step = np.nonzero(drafted)
        at = slots[row]
        positions = windows.positions
        ks = np.minimum(spec_tokens[row, step], positions)
        accepted = np.minimum(np.maximum(lengths[row, step], 1) - 1, ks)
        tasks = windows.task[at]
        counts = windows.counts[at]  # [n, 2, positions]: the windows the decisions saw
        strength = self.choices[None, :, None]
        p = (counts[:, None, 0] + strength * self.rates[tasks][:, None, :]) / (
            counts[:, None, 1] + strength
        )
        np.clip(p, 1e-6, 1.0 - 1e-6, out=p)
        hit = windows.position < accepted[:, None]  # [n, positions]
        miss = (windows.position == accepted[:, None]) & (accepted < ks)[:, None]
        loglik = np.einsum("ncp,np->nc", np.log(p), hit) + np.einsum(
            "ncp,np->nc", np.log1p(-p), miss
        )
        for task in np.unique(tasks).tolist():
            mine = tasks == task
            n = int(mine.sum())
            keep = self._keep**n
            self.loglik[task] = self.loglik[task] * keep + loglik[mine].sum(axis=0)
            self.scored[task] = self.scored[task] * keep + n
            if self.scored[task] >= self._min_steps:
                self.strengths[task] = self.choices[int(np.argmax(self.loglik[task]))]

    def view(self) -> dict[str, Any]:
        """Per task its strength now and each candidate's log-likelihood per scored step."""
        return {
            task.value: {
                "strength": float(self.strengths[i]),
                "scored_steps": round(float(self.scored[i]), 1),
                "loglik_per_step": {
                    f"{c:g}": round(float(v / self.scored[i]), 4) if self.scored[i] else None
                    for c, v in zip(self.choices, self.loglik[i], strict=True)
                },
            }
            for i, task in enumerate(TASKS)
        }


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
        self._positions = max(1, types.max_spec_tokens(block_size))
        self._max_k = min(max_spec_tokens or self._positions, self._positions)
        self._min_k = min(min_spec_tokens, self._max_k)
        self._rng_u = rng_u or (lambda: 1.0)
        self._fallback_cost = RelativeCost(spec.verify_width_multiple)
        self.windows = RowWindows(
            spec.request_window_steps,
            self._positions,
            plain_per_entry=spec.request_plain_entry_steps,
        )
        self._strength = spec.request_prior_strength
        # Per task: the rates decisions blend with (the priors until a decision reads the task's)
        self._prior_rates = np.array([spec.prior_for(task, self._positions) for task in TASKS])
        # ``request_strength_choices``: each task's strength learnt (``StrengthChooser``)
        self.strength_chooser: StrengthChooser | None = None
        if spec.request_strength_choices:
            self.strength_chooser = chooser = StrengthChooser(
                spec.request_strength_choices,
                spec.request_strength_half_life_steps,
                spec.request_strength_min_steps,
                spec.request_prior_strength,
                self._prior_rates,
            )
            self.windows.before_advance = functools.partial(chooser.score, self.windows)
        self._decided = 0  # the last decision: the hold reference (a probe is not one)
        # Drain (``drain_makespan``): decisions since a row left with none joining since (0:
        # none), and whether the last decision was made as the batch drained.
        self._quiet = 0
        self.draining = False
        self.spec_tokens_now = 0  # the k of the last step, probe or not
        self._plain_run = 0  # steps the batch has run plain in a row (``_reprobe``)
        self.steps = 0
        self._last: tuple[str, int, int, float] = ("none", 0, 0, 1.0)
        # The last decision's expected tokens of the whole batch at k = 0..positions (its
        # rows' blended estimates; what the gain in ``reason`` was computed from).
        self.last_totals: list[float] = []
        # ... and its best drafting k, chosen or not: (k, its expected rate over a plain
        # step's, the priced seconds of a plain step and of that k's): why a batch went plain.
        # (The rate is tokens a second also where a drain scored the k by its finishing rate.)
        self.last_drafting: tuple[int, float, float, float] = (0, 0.0, 0.0, 0.0)
        # ``shared_calibration``: decayed sums of the drafted tokens the decided rows realized
        # and of those the decisions expected of them; the drafted part of every expectation
        # is scaled by their ratio (``calibration``).
        # ``calibration_by_task``: one pair of sums per task (each aged by its own row-steps),
        # else one pair for every row.
        groups = len(TASKS) if spec.calibration_by_task else 1
        self._realized = [0.0] * groups
        self._expected = [0.0] * groups
        self._factors = np.ones(len(TASKS))  # ``calibrations``: 1 until ``_calibrate`` runs
        # Steps of one padded width cost the same: only the largest k of each can win. The
        # widths are the step cost's (an engine whose rows verify at their own widths prices
        # every k: multiple 1), known only once the cost arrives (``_candidates_for``); probes
        # step by the policy's captured width either way.
        self._multiple = spec.verify_width_multiple
        self._candidates = self._candidates_for(self._multiple)
        self._probe_targets = self._candidates

    def _candidates_for(self, multiple: int) -> list[int]:
        """0 and the largest k in [min_k, max_k] of each padded width of ``multiple``."""
        return sorted(
            {0}
            | {
                min(self._max_k, padded_width(k, multiple) - 1)
                for k in range(self._min_k, self._max_k + 1)
            }
        )

    def decide(
        self, rows: Sequence[StepRow], learned: Learned, remaining: Sequence[int] | None = None
    ) -> int:
        """k for every row of this engine step (each row runs it clamped to its ceiling).
        ``remaining``: per row, the tokens it may still emit (its room), which the drain rule
        reads (``drain_makespan``); None: not known, the rule stays off."""
        if not rows:
            return 0
        row_ids, tasks, accept_lengths, spec_tokens, ceilings = zip(
            *map(_fields, rows), strict=True
        )
        slots = self.windows.ingest(row_ids, tasks, accept_lengths, spec_tokens)
        self._track_drain()
        # steps the batch has run plain in a row (those just ingested ran the last k)
        ran = int(self.windows.last_new[1].shape[1])
        self._plain_run = self._plain_run + ran if self.spec_tokens_now == 0 else 0
        if self._spec.shared_calibration:
            self._calibrate()
        present = self.windows.rows_per_task
        fields = {task: learned(task) for task, n in zip(TASKS, present, strict=True) if n}
        cost: StepCost = self._fallback_cost
        for task, each in fields.items():
            rates = self._fill(task, each.get("accept_rates", ()))
            self._prior_rates[TASK_INDEX[task]] = rates
            cost = each.get("step_cost") or cost
        multiple = getattr(cost, "verify_width_multiple", self._spec.verify_width_multiple)
        if multiple != self._multiple:
            self._multiple, self._candidates = multiple, self._candidates_for(multiple)
        rooms = remaining if self.draining and self._spec.drain_makespan else None
        totals, per_row = self._expected_totals(slots, ceilings, per_row=rooms is not None)
        self.last_totals = totals
        ceiling = max(0, min(max(ceilings), self._positions))
        worth: Sequence[float] = totals
        if rooms is not None and per_row is not None:
            worth = _finishing_rates(per_row, rooms).tolist()
        k = self._choose(worth, len(rows), cost, ceiling, fields, totals)
        if self._spec.shared_calibration:  # what each row runs: k within its ceiling
            self.windows.decided[slots] = np.minimum(k, np.asarray(ceilings))
        self.spec_tokens_now = k
        self.steps += 1
        return k

    def _track_drain(self) -> None:
        """``draining``: no row has joined in the last ``drain_quiet_decisions`` decisions,
        the first of them seeing a row leave (a row that leaves is usually replaced a call
        later, which ends it)."""
        windows = self.windows
        if windows.joined:
            self._quiet = 0
        elif self._quiet or windows.left:
            self._quiet += 1
        self.draining = self._quiet >= self._spec.drain_quiet_decisions

    def _expected_totals(
        self, slots: np.ndarray, ceilings: Sequence[int], per_row: bool = False
    ) -> tuple[list[float], np.ndarray | None]:
        """sum over rows of E_r(k) for k = 0..positions, each row's E_r capped at its ceiling,
        and with ``per_row`` every row's own E_r(k) ([rows, positions + 1]; else None).

        E_r is the task rates blended with the row's window as ``blend_request_history``
        blends them: ``(beyond + strength x rate) / (trials + strength)`` per position.
        """
        windows = self.windows
        counts = windows.counts[slots]
        tasks = windows.task[slots]
        chooser = self.strength_chooser  # (``request_strength_choices``: learnt per task)
        strength = self._strength if chooser is None else chooser.strengths[tasks][:, None]
        blended = (counts[:, 0] + strength * self._prior_rates[tasks]) / (counts[:, 1] + strength)
        survive = blended.cumprod(axis=1)  # [rows, positions]: all of 1..j accepted
        if min(ceilings) < self._positions:  # rows near their end verify fewer positions
            survive *= windows.position < np.array(ceilings)[:, None]
        batch = float(len(slots))
        if self._spec.shared_calibration:  # each row's E_r(k), for ``_calibrate`` to check
            windows.expected[slots, 0] = 1.0
            windows.expected[slots, 1:] = 1.0 + survive.cumsum(axis=1)
            survive *= self.calibrations[tasks][:, None]
        drafted = survive.sum(axis=0).cumsum()
        totals = [batch, *(batch + value for value in drafted.tolist())]
        if not per_row:
            return totals, None
        rows = np.ones((len(slots), self._positions + 1))
        np.cumsum(survive, axis=1, out=rows[:, 1:])
        rows[:, 1:] += 1.0
        return totals, rows

    @property
    def calibrations(self) -> np.ndarray:
        """Per task (``TASKS`` order), the factor on the drafted part of its rows'
        expectations: 1 unless ``shared_calibration``, else realized over expected drafted
        tokens of the rows the batch-wide decisions drafted (that task's rows with
        ``calibration_by_task``, else every row; decayed with ``calibration_half_life_steps``,
        shrunk towards 1 by ``prior_strength`` tokens; within 0.25-1.5). Kept up to date by
        ``_calibrate`` (read on every decision)."""
        return self._factors

    @property
    def calibration(self) -> float:
        """The factor over every task's rows together (a summary for views and tests; the
        decisions use ``calibrations``)."""
        if not self._spec.shared_calibration:
            return 1.0
        prior = self._spec.prior_strength
        ratio = (sum(self._realized) + prior) / (sum(self._expected) + prior)
        return min(max(ratio, 0.25), 1.5)

    def _calibrate(self) -> None:
        """The steps just ingested against what the last decisions expected of them: each
        drafted row-step that ran its decided k adds its accepted drafts and the drafts
        expected at that k; every row-step ages the sums of its group (its task's with
        ``calibration_by_task``; a plain one as ``plain_step_age`` of a drafted one), so
        while nothing drafts the factor drifts back to 1 and drafting is tried again.
        Only steps that ran the k the decision gave them count: a probe's wider width, or a
        two-phase step's per-row k from the draft's confidence, was not that decision's."""
        windows = self.windows
        rows, ks, lengths = windows.last_new
        if not len(rows):
            return
        groups = len(self._realized)
        ks = np.minimum(ks, self._positions)
        if ks.size <= 16:  # a few row-steps (one row, a short hold): plain Python is faster
            ages, realized, wanted = self._tally_few(rows, ks, lengths, groups)
        else:
            ages, realized, wanted = self._tally_many(rows, ks, lengths, groups)
        spec = self._spec
        prior = spec.prior_strength
        factors = []
        for g in range(groups):
            keep = 0.5 ** (ages[g] / spec.calibration_half_life_steps)
            self._realized[g] = self._realized[g] * keep + realized[g]
            self._expected[g] = self._expected[g] * keep + wanted[g]
            ratio = (self._realized[g] + prior) / (self._expected[g] + prior)
            factors.append(min(max(ratio, 0.25), 1.5))
        self._factors = np.array(factors if groups > 1 else factors * len(TASKS))

    def _tally_few(
        self, rows: np.ndarray, ks: np.ndarray, lengths: np.ndarray, groups: int
    ) -> tuple[list[float], list[float], list[float]]:
        """Per group: row-steps that age it, accepted drafts and expected drafts."""
        windows = self.windows
        ages, realized, wanted = [0.0] * groups, [0.0] * groups, [0.0] * groups
        plain_age = self._spec.plain_step_age
        expected = windows.expected[rows].tolist()
        decided = windows.decided[rows].tolist()
        tasks = windows.task[rows].tolist() if groups > 1 else [0] * len(rows)
        for row, (row_ks, row_lengths) in enumerate(
            zip(ks.tolist(), lengths.tolist(), strict=True)
        ):
            group, want_k, row_expected = tasks[row], decided[row], expected[row]
            for k, length in zip(row_ks, row_lengths, strict=True):
                if k == 0:
                    ages[group] += plain_age
                elif k == want_k and row_expected[k] == row_expected[k]:  # (not NaN)
                    ages[group] += 1.0
                    realized[group] += length - 1
                    wanted[group] += row_expected[k] - 1.0
        return ages, realized, wanted

    def _tally_many(
        self, rows: np.ndarray, ks: np.ndarray, lengths: np.ndarray, groups: int
    ) -> tuple[list[float], list[float], list[float]]:
        """``_tally_few`` for many row-steps, vectorised."""
        windows = self.windows
        expected = windows.expected[rows[:, None], ks]
        decided = ks == windows.decided[rows][:, None]
        drafted = (ks > 0) & decided & ~np.isnan(expected)
        ages = drafted.sum(axis=1) + self._spec.plain_step_age * (ks == 0).sum(axis=1)
        realized = np.where(drafted, lengths - 1, 0).sum(axis=1)
        wanted = np.where(drafted, expected - 1.0, 0.0).sum(axis=1)
        if groups == 1:
            return [float(ages.sum())], [float(realized.sum())], [float(wanted.sum())]
        tasks = windows.task[rows]
        return (
            np.bincount(tasks, weights=ages, minlength=groups).tolist(),
            np.bincount(tasks, weights=realized, minlength=groups).tolist(),
            np.bincount(tasks, weights=wanted, minlength=groups).tolist(),
        )

    def _fill(self, task: Task, rates: Sequence[float]) -> list[float]:
        out = list(rates[: self._positions])
        if len(out) < self._positions:
            out += self._spec.prior_for(task, self._positions)[len(out) :]
        return out

    def _choose(
        self,
        worth: Sequence[float],
        batch: int,
        cost: StepCost,
        ceiling: int,
        fields: Mapping[Task, Mapping[str, Any]],
        totals: Sequence[float],
    ) -> int:
        """The k of the best ``worth[k] / T(B, k)``. ``worth`` is ``totals`` (the batch's
        expected tokens a step: a score in tokens a second) or, while draining, its finishing
        rate a step (``_finishing_rates``); ``last_drafting`` reports tokens a second either
        way, from ``totals``."""
        spec = self._spec

        def score(k: int) -> float:  # the engine clamps every row: the step runs min(k, ceiling)
            return worth[k] / cost.step_time_s(batch, min(k, ceiling))

        plain_s = cost.step_time_s(batch, 0)
        plain = worth[0] / plain_s
        draft_k, draft = 0, 0.0  # the best drafting k, chosen or not
        for k in self._candidates[1:]:
            value = score(k)
            # a tie goes to the wider k: every k from the batch's ceiling up runs the same
            # step, and the narrower one, decided for a request about to end, would be held
            # (``hysteresis``) for the wide-open request after it (8B arm, s48c: k 14 for a
            # whole math phase where 15 paid 2% more)
            if value >= draft:
                draft_k, draft = k, value
        best_k = draft_k if draft > plain * (1.0 + spec.min_gain) else 0
        if draft_k:
            draft_s = cost.step_time_s(batch, min(draft_k, ceiling))
            rate = totals[draft_k] / draft_s / (totals[0] / plain_s)
            self.last_drafting = (draft_k, rate, plain_s, draft_s)
        why, previous = "best" if worth is totals else "drain", self._decided
        if self.steps and previous != best_k:
            if score(previous) * (1.0 + spec.hysteresis) >= score(best_k):
                best_k, why = previous, "hold"
        self._decided = best_k
        probe = self._probe(best_k, ceiling, fields)
        if probe is not None:
            best_k, why = probe, "probe"
        elif best_k == 0 and self._reprobe(draft_k, draft / plain):
            best_k, why = draft_k, "probe"
        self._last = (why, batch, best_k, score(best_k) / plain)
        return best_k

    @property
    def reads_rooms(self) -> bool:
        """Whether ``decide`` reads its ``remaining`` (``drain_makespan``)."""
        return self._spec.drain_makespan

    @property
    def reason(self) -> str:
        """Why the last step's k, e.g. ``batch[best] B=64 k=15 1.31x plain``."""
        return describe(self._last)

    @property
    def last(self) -> tuple[str, int, int, float]:
        """The last decision as (why, batch, k, gain over plain); ``describe`` formats it."""
        return self._last

    def _reprobe(self, draft_k: int, gain: float) -> bool:
        """A batch plain for ``request_reprobe_steps`` steps in a row drafts one step at its
        best drafting k while that k is within ``request_probe_margin`` of a plain step: its
        rows' windows, which plain steps leave as they were, see whether their text turned
        easier. (The per-request policy's re-probe, for the batch as a whole; 0 = never.)"""
        every = self._spec.request_reprobe_steps
        if not every or not draft_k or self._plain_run < every:
            return False
        if gain < 1.0 - self._spec.request_probe_margin:
            return False
        self._plain_run = 0
        return True

    def _probe(
        self, spec_tokens: int, ceiling: int, fields: Mapping[Task, Mapping[str, Any]]
    ) -> int | None:
        """One captured width wider, while a batch task has few recent steps that drafted it."""
        wider = [k for k in self._probe_targets if k > spec_tokens]
        if not wider or ceiling <= spec_tokens or self._rng_u() >= self._spec.probe_probability:
            return None
        target = wider[0]
        for task, each in fields.items():
            rates = self._prior_rates[TASK_INDEX[task]].tolist()
            trials = each.get("accept_trials", ())
            if drafted_steps(rates, trials, spec_tokens, target) < self._spec.probe_min_steps:
                return target
        return None


def _finishing_rates(per_row: np.ndarray, remaining: Sequence[int]) -> np.ndarray:
    """Per k, one over the most steps any row needs to emit what it may still emit at that k
    (its room over its expected tokens a step, ``per_row[:, k]``; a room below one token
    counts as one): over T(B, k), the rate at which a draining batch finishes."""
    room = np.maximum(np.asarray(remaining, dtype=float), 1.0)[:, None]
    value: np.ndarray = 1.0 / (room / per_row).max(axis=0)
    return value


def describe(last: tuple[str, int, int, float]) -> str:
    """A decision of ``BatchWidth`` in words, e.g. ``batch[best] B=64 k=15 1.31x plain``."""
    why, batch, k, gain = last
    return f"batch[{why}] B={batch} k={k} {gain:.2f}x plain"
