"""Runs one policy over the whole trace on a synchronous ``Engine`` and measures it.

The loop is the engine thread's own (``AsyncEngine`` runs the same ``Engine.step``), so the
planner's host time sits inside every measured step, as it does in the daemon.
"""

from __future__ import annotations

import bisect
import gc
import re
import statistics
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.decisions.policies import Built
from bench.decisions.workload import Job, Phase
from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams, SpecController, TokenEvent
from engines.embedded.request import Request
from policies.acceptance import expected_by_k
from policies.costmodel import padded_width
from policies.step_mode import MODE_NAMES
from policies.types import Task

# ``unseen_ends``: a request's stated ``max_new_tokens`` exceeds its job's length by this many
# blocks, so the engine cannot see where it ends (as it cannot see an end-of-sequence token).
UNSEEN_END_BLOCKS = 8
# A shared decision's reason (``policies.batch_width.describe``): why, batch size, k, and the
# gain over a plain step the policy expected.
_BATCH_REASON = re.compile(r"batch\[(\w+)\] B=(\d+) k=(\d+) ([\d.]+)x plain")
_GAIN = re.compile(r"([\d.]+)x plain")  # e.g. a two-phase step's (``SlotAllocator``)
REASONS_KEPT = 12  # the most frequent decision reasons a phase's summary keeps


@dataclass
class PhaseTally:
    tokens: int = 0
    elapsed_s: float = 0.0
    step_s: list[float] = field(default_factory=list)
    row_ks: list[int] = field(default_factory=list)
    accept_by_task: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    host: tuple[float, int] = (0.0, 0)
    # Pure decode steps (no admission) by (batch size, padded verify width): seconds each.
    by_shape: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    # Decode-only share: tokens and seconds of the steps that admitted no request.
    decode_tokens: int = 0
    # Why the planner chose each call's k (``StepController.last_reason``, the batch size
    # left out): [calls, sum of the gain over a plain step it expected] per reason.
    reasons: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0.0]))
    # The last reason tallied, parsed: (the string, its key, its gain); a decision held over
    # several calls gives the same string object, parsed once (the harness's own host time
    # between calls counts in every phase's rate).
    _parsed: tuple[str, str, float] | None = None
    decode_s: float = 0.0
    # Seconds of the calls that admitted spent prefilling (Engine.last_prefill_s): the part of
    # an admitting call that is not its decode steps.
    prefill_s: float = 0.0
    # Every step: [rows that stepped, widest k, 1 if it admitted a request, ms, and for a
    # two-phase step the ms blocked on the draft's confidence and the ms from it to the
    # verify's launch (the allocation on the step's path; both 0 one-phase), the tokens the
    # step verified (sum over rows of k + 1) and the tokens it emitted] (k over time; the last
    # two since session 15: what each step bought for its time), and 1 if it was two-phase
    # (session 42: the draft ran though the widest *verified* k may be 0; a replay that took
    # such steps for plain ones priced the plain step at 3.4x its table); then (session 43)
    # the shared decision in force, for a goodput policy's batch planner (else zeros): its
    # best drafting k, chosen or not, that k's expected rate over a plain step's, and the
    # priced ms of a plain step and of that k's (``BatchWidth.last_drafting``: why a batch
    # went plain, e.g. the real pair's 96 plain 64-row steps after an admission wave, s43e).
    timeline: list[
        tuple[int, int, int, float, float, float, int, int, int, int, float, float, float]
    ] = field(default_factory=list)
    # Two-phase steps' host ms from the draft's confidence to the verify's launch.
    allocation_ms: list[float] = field(default_factory=list)
    # What the policy believed once half the phase's requests were admitted (``planner_view``):
    # its priced step times and expected accept lengths, beside what the steps measured.
    view: dict[str, Any] | None = None
    # Steps whose rows ran different k (a ragged engine's per-row choices), and the tokens
    # each step verified (sum over rows of k + 1: what a ragged verify computes).
    mixed_k_steps: int = 0
    verify_tokens: int = 0
    # The auto step mode's steps as its chooser was told them, in order (rows, two-phase,
    # tokens, ms: ``StepController.mode_told``; session 56: its paired estimates disagreed
    # with a replay of the harness's own step times, bench/mode_replay.py).
    mode_told: list[tuple[int, bool, int, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        host_s, calls = self.host
        return {
            "tok_s": self.tokens / self.elapsed_s if self.elapsed_s else 0.0,
            "tokens": self.tokens,
            "elapsed_s": self.elapsed_s,
            "steps": len(self.step_s),
            "step_ms_mean": 1e3 * statistics.fmean(self.step_s) if self.step_s else None,
            "mean_spec_tokens": statistics.fmean(self.row_ks) if self.row_ks else 0.0,
            "accept_length_by_task": {
                task: statistics.fmean(v) for task, v in self.accept_by_task.items() if v
            },
            "host_us_per_step": 1e6 * host_s / calls if calls else None,
            # tok/s of the steps without a prefill: free of the prefill's run-to-run noise
            "decode_tok_s": self.decode_tokens / self.decode_s if self.decode_s else None,
            "prefill_s": self.prefill_s,
            "mixed_k_steps": self.mixed_k_steps,
            # mean host ms of two-phase steps between the draft's confidence and the verify
            "two_phase_allocation_ms": (
                statistics.fmean(self.allocation_ms) if self.allocation_ms else None
            ),
            "verify_tokens_per_step": (
                self.verify_tokens / len(self.step_s) if self.step_s else None
            ),
            "timeline": [list(step) for step in self.timeline],
            "mode_told": [list(step) for step in self.mode_told],
            "reasons": self.top_reasons(),
            "planner_view": self.view,
        }

    def top_reasons(self) -> dict[str, dict[str, float | None]]:
        """The ``REASONS_KEPT`` most frequent reasons: engine calls, and the mean gain over a
        plain step the policy expected when it chose (shared decisions; None otherwise)."""
        ranked = sorted(self.reasons.items(), key=lambda item: -item[1][0])[:REASONS_KEPT]
        return {
            reason: {"calls": int(calls), "expected_gain": gain / calls if gain else None}
            for reason, (calls, gain) in ranked
        }

    def add_reason(self, reason: str) -> None:
        """Tally one engine call's decision reason (empty: none given)."""
        if not reason:
            return
        parsed = self._parsed
        if parsed is not None and parsed[0] is reason:  # (held decisions: the same string)
            self.reasons[parsed[1]][0] += 1
            self.reasons[parsed[1]][1] += parsed[2]
            return
        found = _BATCH_REASON.fullmatch(reason)
        if found:
            key, gain = f"batch[{found[1]}] k={found[3]}", float(found[4])
        else:  # e.g. "allocator: B=64 ... 1.21x plain (device)": the decider, device or not
            device = " (device)" if reason.endswith("(device)") else ""
            key = reason.partition(":")[0][:40] + device
            shown = _GAIN.search(reason)
            gain = float(shown[1]) if shown else 0.0
        self._parsed = (reason, key, gain)
        entry = self.reasons[key]
        entry[0] += 1
        entry[1] += gain


def run_policy(
    engine: Engine,
    built: Built,
    phases: Sequence[Phase],
    jobs: Sequence[Sequence[Job]],
    multiple: int,
    on_phase: Callable[[str, dict[str, Any]], None] | None = None,
    unseen_ends: bool = False,
) -> list[PhaseTally]:
    """Every phase in turn, closed loop, each drained before the next starts. The garbage
    collector is off while a run is timed (a full collection mid-phase costs tens of ms that
    would land on whichever policy happens to trigger it) and collects between runs.

    ``unseen_ends``: each request ends at its job's length as at an end-of-sequence token
    the engine could not foresee: it is submitted with ``UNSEEN_END_BLOCKS`` blocks more
    room, its tokens past the job's length are not counted, and it is aborted after the
    ``engine.step()`` call that reached that length. A drafting burst then runs its steps
    past a row's end as real traffic makes it (scratch, and a slot held until the burst
    ends); with ends the engine sees (``max_new_tokens``, the default), its room rule keeps
    bursts inside every row's length. Every policy still emits the same counted tokens."""
    engine.planner = built.planner
    tallies = []
    gc.collect()
    gc.disable()
    try:
        for phase, phase_jobs in zip(phases, jobs, strict=True):
            tally = _run_phase(engine, built, phase, phase_jobs, multiple, unseen_ends)
            tallies.append(tally)
            if on_phase is not None:
                on_phase(phase.name, tally.summary())
    finally:
        gc.enable()
        engine.planner = None
    return tallies


def _run_phase(
    engine: Engine,
    built: Built,
    phase: Phase,
    jobs: Sequence[Job],
    multiple: int,
    unseen_ends: bool = False,
) -> PhaseTally:
    tally = PhaseTally()
    if hasattr(built.planner, "mode_told"):  # (a step controller: its chooser's inputs)
        built.planner.mode_told = tally.mode_told
    queue = deque(jobs)
    tasks = {job.key: job.task.value for job in jobs}
    # unseen ends: tokens each request may still count (its job's length less what it had)
    left = {job.key: job.max_new_tokens for job in jobs}
    slack = UNSEEN_END_BLOCKS * engine.block_size if unseen_ends else 0
    host_before = built.host()
    started = time.perf_counter()
    halfway = len(jobs) // 2
    while queue or engine.has_work:
        if tally.view is None and len(queue) <= halfway:
            tally.view = planner_view(built.planner, phase.concurrency)
        admitted = False
        while queue and len(engine.scheduler.running) + len(engine.scheduler.waiting) < (
            phase.concurrency
        ):
            engine.add(_request(queue.popleft(), built.controller_for, slack))
            admitted = True
        if hasattr(engine.runner, "last_two_phase_s"):
            engine.runner.last_two_phase_s = (0.0, 0.0)  # a step without a decode leaves it
        step_started = time.perf_counter()
        events = engine.step()
        call_s = time.perf_counter() - step_started
        tally.prefill_s += getattr(engine, "last_prefill_s", 0.0)
        # A call runs one decode step, or a plain burst of several (Engine.plain_burst): each
        # request's i-th report is step i's; the call's time is split evenly between them.
        prefill_tokens = 0  # the admitted requests' first tokens: counted with the first step
        step_ks: list[list[int]] = []
        step_emitted: list[int] = []
        step_two_phase: list[bool] = []
        seen: dict[str, int] = defaultdict(int)
        ended: list[str] = []  # unseen ends reached in this call
        for request, event in events:
            if not isinstance(event, TokenEvent):
                raise RuntimeError(f"request {request.request_id} failed: {event}")
            key = request.request_id
            before = left[key]
            counted = min(len(event.token_ids), before)
            left[key] -= counted
            if unseen_ends and before and not left[key] and not event.finished:
                ended.append(key)
            if event.report is None:
                prefill_tokens += counted
                continue
            index = seen[request.request_id]
            seen[request.request_id] += 1
            if index == len(step_ks):
                step_ks.append([])
                step_emitted.append(0)
                step_two_phase.append(False)
            step_ks[index].append(event.report.spec_tokens)
            step_two_phase[index] = step_two_phase[index] or event.report.two_phase
            step_emitted[index] += counted
            if before:  # (not a burst's scratch step past an unseen end)
                tally.accept_by_task[tasks[key]].append(event.report.accept_length)
        for key in ended:
            engine.abort(key)
        if step_ks:  # (a call that only prefilled planned nothing: its reason is the last's)
            tally.add_reason(getattr(built.planner, "last_reason", ""))
        else:
            step_ks, step_emitted, step_two_phase = [[]], [0], [False]
        step_emitted[0] += prefill_tokens
        waited_s, allocation_s = getattr(engine.runner, "last_two_phase_s", (0.0, 0.0))
        if allocation_s:
            tally.allocation_ms.append(1e3 * allocation_s)
        width = getattr(built.planner, "batch_width", None)
        drafting = width.last_drafting if width is not None else (0, 0.0, 0.0, 0.0)
        steps = zip(step_ks, step_emitted, step_two_phase, strict=True)
        for index, (ks, emitted, two_phase) in enumerate(steps):
            first = index == 0
            _tally_step(
                tally,
                ks,
                emitted,
                two_phase,
                call_s / len(step_ks),
                # every step of a call that admitted: its even share of the call's time holds
                # a share of the prefill (counted as decode-only, a burst's steps looked
                # slower by it than single steps, which keep the prefill in their first)
                admitted,
                (waited_s, allocation_s) if first else (0.0, 0.0),
                multiple,
                drafting,
            )
    tally.elapsed_s = time.perf_counter() - started
    if hasattr(built.planner, "mode_told"):
        built.planner.mode_told = None
    host_after = built.host()
    tally.host = (host_after[0] - host_before[0], host_after[1] - host_before[1])
    return tally


VIEW_KS = (0, 3, 7, 11, 15)


def planner_view(planner: Any, batch: int) -> dict[str, Any] | None:
    """What a learning planner believes now, for a step of ``batch`` rows: its priced step
    ms at each k of ``VIEW_KS`` (within the block), and per task its conditional acceptance
    per position, their trials, and the accept length (bonus token included) it expects at
    each k; its last batch-wide decision (why, rows, k, gain over a plain step, and the
    accept length per row it expected at each k, the rows' own histories blended in); its
    step-mode chooser's buckets (auto mode: per batch-size bucket the mode it runs outside
    probes, each mode's measured tok/s and the paired two-phase over one-phase ratio it chooses
    on; session 41's `goodput-device` ran no two-phase step at 64 rows and nothing said why).
    None for a planner without online models (static k, vLLM's rule, the oracle)."""
    models = planner.models() if hasattr(planner, "models") else None
    if models is None:
        return None
    cost = models.step_cost()
    positions = models.block_size - 1
    ks = [k for k in VIEW_KS if k <= positions]
    view: dict[str, Any] = {"batch": batch}
    if cost is not None:
        view["step_ms"] = {k: round(1e3 * cost.step_time_s(batch, k), 3) for k in ks}
        view["cost_fit"] = cost_fit(models.cost, batch)
    tasks = {}
    for task in Task:
        fields = models.observe(task)
        rates = list(fields["accept_rates"])[:positions]
        expected = expected_by_k(rates)
        tasks[task.value] = {
            "rates": [round(r, 3) for r in rates],
            "trials": [round(t, 1) for t in list(fields["accept_trials"])[:positions]],
            "expected_accept": {k: round(expected[min(k, len(rates))], 3) for k in ks},
        }
    view["tasks"] = tasks
    width = getattr(planner, "batch_width", None)
    if width is not None:
        why, rows, k, gain = width.last
        totals = width.last_totals
        view["last_shared"] = {
            "why": why,
            "rows": rows,
            "k": k,
            "gain": round(gain, 3),
            # what it expected a row to emit at each k (its rows' own histories blended in)
            "expected_accept_per_row": {
                j: round(totals[j] / rows, 3) for j in ks if rows and j < len(totals)
            },
        }
        # the factor on each task's drafted expectations (1 unless ``shared_calibration``)
        view["calibration"] = {
            task: round(factor, 3) for task, factor in planner.calibrations().items()
        }
        chooser = width.strength_chooser
        if chooser is not None:  # ``request_strength_choices``: each task's learnt strength
            view["request_strength"] = chooser.view()
    modes = getattr(planner, "step_modes", None)
    if modes is not None:
        view["step_modes"] = [
            {
                "rows": bucket.rows,
                "incumbent": MODE_NAMES[bucket.incumbent],
                "one_phase_tok_s": _rounded(bucket.one_phase_tok_s),
                "two_phase_tok_s": _rounded(bucket.two_phase_tok_s),
                "paired_ratio": _rounded(bucket.paired_ratio, 4),
                "pairs": bucket.pairs,
            }
            for bucket in modes()
        ]
    return view


def _rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def cost_fit(model: Any, batch: int) -> dict[str, Any]:
    """The online cost fit of the table row nearest ``batch`` (at or above it): the row's
    factor and overhead, how many captured widths it has seen (its overhead is separated
    only across two), and each width's own ratio to the table and how far it has replaced
    the row's fit."""
    sizes = model.table.batch_sizes
    row = min(bisect.bisect_left(sizes, batch), len(sizes) - 1)
    snap = model.snapshot()
    return {
        "row": sizes[row],
        "correction": round(snap.corrections[row], 4),
        "overhead_ms": round(1e3 * snap.overheads_s[row], 4),
        "widths_seen": model.widths_seen(row),
        "widths": {
            width: [round(ratio, 4), round(weight, 3)]
            for width, (ratio, weight) in zip(model.widths, model.width_fits()[row], strict=True)
        },
        # per width that has run: [steps folded in, and its most out-of-line step's batch
        # size, predicted ms, observed ms, and the steps folded in clipped to a multiple of
        # their price] (a fit pulled far from the table by stalls)
        "width_steps": {
            width: [steps, worst[0], round(1e3 * worst[1], 3), round(1e3 * worst[2], 3), clipped]
            for width, (steps, clipped, worst) in zip(
                model.widths, model.width_steps(row), strict=True
            )
            if steps and worst is not None
        },
    }


def _tally_step(
    tally: PhaseTally,
    ks: list[int],
    emitted: int,
    two_phase: bool,
    step_s: float,
    admitted: bool,
    two_phase_s: tuple[float, float],
    multiple: int,
    drafting: tuple[int, float, float, float] = (0, 0.0, 0.0, 0.0),
) -> None:
    """One decode step into the phase's tally: its rows' k, the tokens it emitted, its time."""
    tally.step_s.append(step_s)
    tally.tokens += emitted
    tally.row_ks += ks
    tally.mixed_k_steps += int(len(set(ks)) > 1)
    tally.verify_tokens += sum(ks) + len(ks)
    waited_s, allocation_s = two_phase_s
    tally.timeline.append(
        (
            len(ks),
            max(ks, default=0),
            int(admitted),
            round(1e3 * step_s, 3),
            round(1e3 * waited_s, 3),
            round(1e3 * allocation_s, 3),
            sum(ks) + len(ks),
            emitted,
            int(two_phase),
            drafting[0],
            round(drafting[1], 4),
            round(1e3 * drafting[2], 4),
            round(1e3 * drafting[3], 4),
        )
    )
    if ks and not admitted:  # (a two-phase step's shape is its own: "64x8t")
        shape = f"{len(ks)}x{padded_width(max(ks), multiple)}{'t' if two_phase else ''}"
        tally.by_shape[shape].append(step_s)
        tally.decode_tokens += emitted
        tally.decode_s += step_s


def _request(job: Job, controller_for: Callable[[Job], SpecController], slack: int = 0) -> Request:
    """``slack``: room past the job's length the engine is told of (unseen ends)."""
    params = SamplingParams(max_new_tokens=job.max_new_tokens + slack)
    context = {"task": job.task.value, "synthetic_key": job.key}
    return Request(job.key, list(job.prompt_ids), params, controller_for(job), context)
