"""The synchronous engine: each ``step()`` admits waiting requests (prefill), chooses k for every
running request, runs one batched speculative step, and reports per request.

    schedule (admit + prefill) -> choose k per row -> runner.step -> postprocess (emit, release)

k comes from the engine's ``planner`` (one call per step for all rows: what a padded batch
needs) when it has one, else from each request's own controller; either way it is clamped to
what the row can run (``RequestView.max_spec_tokens``).

Failure isolation: ``add`` refuses what could only fail later (ValueError naming the field). A
request whose prefill, preparation, row of the batched step or postprocessing raises ends alone:
``step`` returns a ``RequestFailed`` in place of its ``TokenEvent`` and releases its slot; the
other rows of the step go on. A controller that raises only costs its request drafting (k = 0).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from engines.embedded.events import (
    DeviceSlotPlanner,
    FailureStage,
    PreparesAllocation,
    RequestFailed,
    RequestView,
    SlotPlanner,
    SpecController,
    StepPlanner,
    StepReport,
    TimesCalls,
    TimesPrefills,
    TokenEvent,
)
from engines.embedded.request import Request
from engines.embedded.runner import (
    DEFERRED_POSITIONS,
    Allocate,
    ModelRunner,
    PlainBurst,
    StepResult,
)
from engines.embedded.scheduler import Scheduler
from policies.slot_scoring import SlotScoring
from policies.types import PositionValues, clamp_spec_tokens, max_spec_tokens

logger = logging.getLogger(__name__)

StepEvent = tuple[Request, TokenEvent | RequestFailed]


# Prompts prefilled together pad to the longest: a forward's rows x longest prompt stays
# within this many tokens (its attention mask holds rows x heads/kv_heads x longest^2 bools).
PREFILL_PADDED_TOKENS = 4096
# Plain steps per host round trip on a CUDA device when every row has k = 0 (``Engine``'s
# ``plain_burst``): the device's idle time between steps (the host's bookkeeping, the
# inputs' copies, the graph launch) comes once per burst.
PLAIN_BURST = 4
# The same for drafting steps (``Engine``'s ``spec_burst``): one-phase steps with k fixed for
# the burst, and two-phase steps allocated on the device under one scoring and budget (each
# step's allocation reads its own draft confidence; ``ModelRunner.spec_steps``).
# Session 32 (H100, policy harness, 3 blocks): static k = 7 1.026x overall (outside the A/A
# spread); goodput 1.029x in the batch-1 phase, 1.011x overall (not clearly outside it); a
# batch-1 k = 15 engine step 7% faster (H200, session 31). docs/ragged-log.md "Session 32".
SPEC_BURST = 4
# A drafting burst may draft fewer tokens for rows near their length limit (each row needs
# room for its k + 1 tokens in every step of the burst), but no more than this share of the
# step's drafted tokens: in a wide batch one row's end no longer cuts every row's burst short,
# and a lone row at its end runs single steps at its own k instead of a burst of narrow ones.
BURST_CUT_SHARE = 0.125


@dataclass
class StepCount:
    """Decode steps of one kind and the host round trips (``runner`` calls) they took."""

    steps: int = 0
    round_trips: int = 0

    def add(self, steps: int) -> None:
        self.steps += steps
        self.round_trips += 1


# isinstance against a runtime-checkable protocol walks the protocol's members on every call
# (~15-30 us each on Python 3.11, several a step); a planner's class decides it, so once per
# (class, protocol).
_IMPLEMENTS: dict[tuple[type, Any], bool] = {}


def _implements(obj: object, protocol: Any) -> bool:
    """``isinstance(obj, protocol)`` for a runtime-checkable protocol whose members are
    methods (the step planners'), memoised per class."""
    key = (type(obj), protocol)
    found = _IMPLEMENTS.get(key)
    if found is None:
        found = _IMPLEMENTS[key] = isinstance(obj, protocol)
    return found


def plan_prefills(lengths: list[int], budget: int = PREFILL_PADDED_TOKENS) -> list[list[int]]:
    """Consecutive runs of admitted requests (by index) prefilled in one forward each: a run
    grows while (rows x its longest prompt) stays within ``budget``; a longer prompt alone."""
    groups: list[list[int]] = []
    longest = 0
    for index, length in enumerate(lengths):
        if groups and (len(groups[-1]) + 1) * max(longest, length) <= budget:
            groups[-1].append(index)
            longest = max(longest, length)
        else:
            groups.append([index])
            longest = length
    return groups


class Engine:
    # the share of a drafting burst's planned tokens its cuts may take (an instance may set
    # its own: benches and tests compare shares)
    burst_cut_share: float = BURST_CUT_SHARE

    def __init__(
        self,
        runner: ModelRunner,
        max_batch_size: int,
        max_seq_len: int,
        planner: StepPlanner | None = None,
        plain_burst: int | None = None,
        spec_burst: int | None = None,
        plain_chain: bool | None = None,
    ) -> None:
        """``plain_burst`` (default: ``PLAIN_BURST`` on a CUDA device, else 1): a step where
        every row has k = 0 runs up to this many plain steps queued back to back, with one
        host round trip (``ModelRunner.plain_steps``); their tokens and reports come out as
        that many steps' events. 1: one step per ``step()`` call. ``spec_burst`` (default:
        ``SPEC_BURST`` on a CUDA device, else 1): the same for drafting steps
        (``ModelRunner.spec_steps``): one-phase, each row at the k planned for the burst's
        first step; two-phase allocated on the device (a ``DeviceSlotPlanner``'s step), the
        first step's scoring and budget for the burst, each step allocated on its own draft
        confidence. ``plain_chain``: a plain burst is followed by the next, queued on
        the device before the host reads the first (``ModelRunner.plain_queue``), so the
        device runs plain bursts back to back while the host handles the last one's tokens
        and plans (the next burst's k: the planner's, one burst stale, the chain going on
        while every row is planned k = 0). A call then returns the burst queued by the call
        before; the chain stops for an admission, a row's end, an abort or a drafting plan,
        its queued burst read first. Default: on a CUDA device (session 46, H100: the real
        pair's no-spec 1.12x and goodput 1.08x faster, the 8B shape's plain decode 2-3%),
        else off."""
        cuda = runner.device.type == "cuda"
        if plain_burst is None:
            plain_burst = PLAIN_BURST if cuda else 1
        if spec_burst is None:
            spec_burst = SPEC_BURST if cuda else 1
        for name, value in (("plain_burst", plain_burst), ("spec_burst", spec_burst)):
            if not 1 <= value <= DEFERRED_POSITIONS:
                raise ValueError(f"{name}={value}: use 1 to {DEFERRED_POSITIONS}")
        self.plain_burst = plain_burst
        self.spec_burst = spec_burst
        self.plain_chain = cuda if plain_chain is None else plain_chain
        # The chained plain burst queued on the device and not read yet (``plain_chain``);
        # requests whose end came in a burst read while it held them (released once it is
        # read); events read outside ``step`` (an abort reads the chain), returned by the next.
        self._chain: PlainBurst | None = None
        self._chain_ended: set[str] = set()
        self._held_events: list[StepEvent] = []
        # Decode steps run and the host round trips they took, plain (every row at k = 0)
        # and drafting: steps over round trips is how much the bursts batch (metrics).
        self.step_counts: dict[str, StepCount] = {"plain": StepCount(), "drafting": StepCount()}
        self.runner = runner
        self.planner = planner
        # Host seconds the last ``step`` spent on admitted requests' prefills (0: it admitted
        # none): what a call that admits costs beyond its decode steps (benchmarks).
        self.last_prefill_s = 0.0
        # This step's rows as the planner saw them, and their controllers.
        self._planned: tuple[list[RequestView], list[SpecController]] = ([], [])
        # The last step's rows (a plain burst: each of its steps'), not yet told to it.
        self._unrecorded: list[list[StepEvent]] = []
        self._call_steps = 0  # the steps the current decode call ran (``_decode``)
        # The last device-allocated step's scores (a burst: each of its steps'), not yet told
        # to the planner that made them (told while the device runs the next step's draft or
        # verify, or when the engine runs out of rows): (planner, rows as it saw them, their
        # controllers, the results).
        self._unscored: (
            tuple[DeviceSlotPlanner, list[RequestView], list[SpecController], list[StepResult]]
            | None
        ) = None
        self.block_size = runner.block_size
        self.max_seq_len = max_seq_len
        # What the loaded target can embed (the tokenizer's vocabulary may differ).
        self.vocab_size = runner.target.embed_tokens.num_embeddings
        self.scheduler = Scheduler(max_batch_size)
        self._generators: dict[str, torch.Generator] = {}
        self._shared_generator = torch.Generator().manual_seed(0)
        # A greedy request's uniforms: all zeros, one tensor shared by every greedy row and
        # step (read only: stacked, never written), instead of a new one per row per step.
        self._greedy_uniforms = torch.zeros(2 * self.block_size + 1)

    def validate(self, request: Request) -> None:
        """Refuse a request that could only fail inside a step: ValueError naming the field.

        No side effects, so a caller on another thread may run it before submitting.
        (``SamplingParams`` checks its own fields' types and ranges when it is built.)"""
        ids = request.prompt_ids
        if not ids:
            raise ValueError(f"request {request.request_id}: prompt_ids is empty")
        bad = next((i for i, t in enumerate(ids) if not _is_token(t, self.vocab_size)), None)
        if bad is not None:
            raise ValueError(
                f"request {request.request_id}: prompt_ids[{bad}]={ids[bad]!r}: token ids must "
                f"be integers in [0, {self.vocab_size}) (the target's vocabulary)"
            )
        total = len(ids) + request.params.max_new_tokens
        if total > self.max_seq_len:
            raise ValueError(
                f"request {request.request_id}: prompt ({len(ids)} tokens) + "
                f"max_new_tokens ({request.params.max_new_tokens}) = {total} exceeds "
                f"max_seq_len={self.max_seq_len}; shorten it or load with a larger max_seq_len"
            )

    def add(self, request: Request) -> None:
        """Queue a request; ValueError (naming the field) for one that could only fail later."""
        self.validate(request)
        seed = request.params.seed
        if seed is not None:
            try:
                generator = torch.Generator().manual_seed(seed)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise ValueError(f"request {request.request_id}: seed={seed!r}: {exc}") from None
            self._generators[request.request_id] = generator
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        if self.scheduler.cancel_waiting(request_id):
            self._generators.pop(request_id, None)
            return
        drained = self._chain is not None  # its rows' slots move only once it is read
        if drained:
            self._held_events += self._drain_chain()
        # (an abort after the drain drops its row's held events too: none reach the caller)
        self._held_events = [e for e in self._held_events if e[0].request_id != request_id]
        if drained:
            self._release_ended(self._held_events)
        for request in self.scheduler.running:
            if request.request_id == request_id:
                self._release(request)
                return

    def reset(self) -> list[Request]:
        """Drop every request (after a crash left the bookkeeping in doubt); return them. The
        caches need no reset: a slot's next prefill writes every position a step reads."""
        self._generators.clear()
        self._chain, self._chain_ended, self._held_events = None, set(), []
        return self.scheduler.reset()

    @property
    def has_work(self) -> bool:
        """Requests to step, or events an abort read from a chained burst, not yet returned."""
        return bool(self._held_events) or self.scheduler.has_work

    def step(self) -> list[StepEvent]:
        events, self._held_events = self._held_events, []
        if self._chain is not None and (self._chain_ended or self.scheduler.waiting):
            events += self._drain_chain()  # a row's end or an admission: the chain stops
            self._release_ended(events)
        admitted = self.scheduler.admit()
        started = time.perf_counter()
        events += self._prefill_admitted(admitted)
        self.last_prefill_s = time.perf_counter() - started if admitted else 0.0
        if admitted and _implements(self.planner, TimesPrefills):
            try:
                cast(TimesPrefills, self.planner).prefill_time(self.last_prefill_s)
            except Exception:
                logger.exception("step planner failed to take a prefill's time")
        self._release_ended(events)  # done or failed after the first token: never join the step
        if self.scheduler.running:
            events += self._decode()
        self._release_ended(events)
        if not self.scheduler.running:  # idle next: no step to hide them behind
            self._tell_scores()
            self._tell_planner()
        return events

    def _prefill_admitted(self, admitted: list[Request]) -> list[StepEvent]:
        """The newly admitted requests' prefills, several per forward (``plan_prefills``); a
        forward that raises is retried one request at a time, so only the culprit fails."""
        events: list[StepEvent] = []
        for group in plan_prefills([len(r.prompt_ids) for r in admitted]):
            requests = [admitted[i] for i in group]
            # Drawn once: a retry one by one samples exactly what the batch would have.
            uniforms: list[torch.Tensor | None] = []
            for request in requests:
                try:
                    uniforms.append(self._uniforms(request))
                except Exception:
                    uniforms.append(None)  # its own prefill below fails it alone
            if len(requests) > 1 and all(u is not None for u in uniforms):
                try:
                    stacked = torch.stack([u for u in uniforms if u is not None])
                    firsts = self.runner.prefill_many(requests, stacked)
                except Exception as exc:
                    logger.warning(
                        "a batched prefill failed (%s: %s); prefilling its requests one by one",
                        type(exc).__name__,
                        (str(exc).splitlines() or [""])[0],
                    )
                else:
                    events += [
                        self._first_event(r, t) for r, t in zip(requests, firsts, strict=True)
                    ]
                    continue
            events += [self._prefill(r, u) for r, u in zip(requests, uniforms, strict=True)]
        return events

    def _prefill(self, request: Request, uniforms: torch.Tensor | None = None) -> StepEvent:
        try:
            drawn = self._uniforms(request) if uniforms is None else uniforms
            return self._first_event(request, self.runner.prefill(request, drawn))
        except Exception as exc:  # this request's own forward or sampling: fail it alone
            return request, self._failed(request, "prefill", exc)

    def _first_event(self, request: Request, token: int) -> StepEvent:
        try:
            return request, self._event(request, [token], None)
        except Exception as exc:
            return request, self._failed(request, "prefill", exc)

    def _decode(self) -> list[StepEvent]:
        """One batched step (or burst) of every running request, its wall time told to a
        planner that prices steps by it (``TimesCalls``) before its steps are recorded."""
        started = time.perf_counter()
        self._call_steps = 0
        events = self._decode_steps()
        if self._call_steps and _implements(self.planner, TimesCalls):
            planner = cast(TimesCalls, self.planner)
            try:
                planner.call_time((time.perf_counter() - started) / self._call_steps)
            except Exception:
                logger.exception("step planner failed to take a call's time")
        return events

    def _decode_steps(self) -> list[StepEvent]:
        """One batched step of every running request; a row that raises leaves it alone."""
        if self._chain is not None:
            return self._chained_burst(self._chain)
        events: list[StepEvent] = []
        plans: dict[str, tuple[int, torch.Tensor]] = {}  # request_id -> (k, uniforms)
        running = list(self.scheduler.running)
        for request, k in zip(running, self._spec_tokens(running), strict=True):
            try:
                plans[request.request_id] = (k, self._uniforms(request))
            except Exception as exc:
                events.append((request, self._failed(request, "prepare", exc)))
                self._release(request)
        running = list(self.scheduler.running)
        drafting = [plans[r.request_id][0] for r in running]
        steps, burst_k = self._burst_plan(running, drafting)
        if steps > 1:
            burst = self._burst(running, burst_k, [plans[r.request_id][1] for r in running], steps)
            if burst is not None:
                return events + burst
        # Uniforms are drawn once, above: a step re-run after dropping a culprit samples
        # exactly what the first attempt would have.
        while rows := list(self.scheduler.running):
            spec_tokens = [plans[r.request_id][0] for r in rows]
            drawn = [plans[r.request_id][1] for r in rows]
            if all(u is self._greedy_uniforms for u in drawn):  # one allocation, no stack
                uniforms = torch.zeros(len(rows), self._greedy_uniforms.shape[0])
            else:
                uniforms = torch.stack(drawn)
            try:
                set_ups = self._set_ups()
                scoring = self._device_scoring(rows, spec_tokens)
                allocate = None if scoring is not None else self._allocation(rows)
                if scoring is not None:
                    result = self.runner.step(
                        rows, spec_tokens, uniforms, overlap=self._overlap, scoring=scoring
                    )
                elif allocate is None:  # (test doubles of the runner take no ``allocate``)
                    result = self.runner.step(rows, spec_tokens, uniforms, overlap=self._overlap)
                else:
                    result = self.runner.step(
                        rows,
                        spec_tokens,
                        uniforms,
                        overlap=self._overlap,
                        allocate=allocate,
                        before_allocate=self._before_allocation(rows),
                    )
            except Exception as exc:
                culprit, error = self._find_culprit(rows, spec_tokens, uniforms, exc)
                events.append((culprit, self._failed(culprit, "step", error)))
                self._release(culprit)
                continue
            verified = result.spec_tokens or spec_tokens
            two_phase = allocate is not None or result.on_device
            if result.on_device:
                self._defer_scores(rows, [result])
            shared = None if two_phase or any(verified) else _plain_report(result)
            first_use = self._set_ups() > set_ups
            stepped = [
                self._postprocess(r, i, verified[i], result, two_phase, shared, first_use)
                for i, r in enumerate(rows)
            ]
            self._unrecorded = [stepped]  # told to the planner while the next step runs
            self._call_steps = 1
            events += stepped
            self.step_counts["drafting" if any(spec_tokens) else "plain"].add(1)
            break
        return events

    def _burst_plan(self, rows: list[Request], spec_tokens: list[int]) -> tuple[int, list[int]]:
        """How many steps this step runs back to back, and each row's k in them. Up to
        ``plain_burst`` when every row has k = 0 (no more than the longest-running row still
        needs). Up to ``spec_burst`` for a one-phase drafting step or a two-phase one allocated
        on the device (k: what each row drafts; it verifies at most that): every row needs room
        (``num_remaining``) for k + 1 tokens in each of the burst's steps, so no row writes past
        its own end; a row without it drafts fewer in this burst (room // steps - 1, k = 0 at
        the least), as long as those cuts stay within ``burst_cut_share`` of the step's drafted
        tokens; the longest burst that keeps to that, else one step at the planned k."""
        if not rows:
            return 1, spec_tokens
        if not any(spec_tokens):
            if self.plain_burst == 1 or not getattr(self.runner, "plain_fast_path", False):
                return 1, spec_tokens  # (test doubles have no plain bursts)
            return max(1, min(self.plain_burst, max(r.num_remaining for r in rows))), spec_tokens
        if self.spec_burst == 1 or not hasattr(self.runner, "spec_steps"):
            return 1, spec_tokens
        if not self._one_phase() and not self._device_bursts():
            return 1, spec_tokens
        drafted = sum(spec_tokens)
        for steps in range(min(self.spec_burst, min(r.num_remaining for r in rows)), 1, -1):
            capped = [
                min(k, r.num_remaining // steps - 1) for r, k in zip(rows, spec_tokens, strict=True)
            ]
            if any(capped) and drafted - sum(capped) <= self.burst_cut_share * drafted:
                return steps, capped
        return 1, spec_tokens

    def _chains(self, rows: list[Request], ahead: int) -> int:
        """How many plain steps a burst queued behind ``ahead`` queued ones may run
        (``plain_chain``; 0: none): every row still running after them (its length;
        a stop token inside them is found when they are read), no request waiting to be
        admitted; up to ``plain_burst``, no more than the longest row still needs."""
        if not self.plain_chain or self.plain_burst == 1 or self.scheduler.waiting:
            return 0
        if not hasattr(self.runner, "plain_queue") or not self.runner.plain_fast_path:
            return 0  # (test doubles)
        if any(r.num_remaining <= ahead for r in rows):
            return 0
        return min(self.plain_burst, max(r.num_remaining for r in rows) - ahead)

    def _start_chain(self, rows: list[Request], bonus: torch.Tensor) -> list[StepResult]:
        """A plain burst (``bonus`` [steps, B]: its bonus uniforms) and the next queued behind
        it (when it may chain), the first read: the second is left running (``_chain``)."""
        first = self.runner.plain_queue(rows, bonus.shape[0], bonus=bonus)
        chained = self._queue_after(first)
        results = self.runner.plain_collect(first, overlap=self._overlap, then=chained)
        self._chain = chained
        return results

    def _queue_after(self, burst: PlainBurst) -> PlainBurst | None:
        """The burst chained behind ``burst`` (same rows), when its rows may run one."""
        steps = self._chains(burst.rows, burst.steps)
        if not steps:
            return None
        try:
            bonus = None  # a sampled row's draws, step by step, row by row (as ``_burst``'s)
            if any(r.params.temperature > 0 for r in burst.rows):
                bonus = torch.stack(
                    [torch.stack([self._uniforms(r)[-1] for r in burst.rows]) for _ in range(steps)]
                )
            return self.runner.plain_queue(burst.rows, steps, after=burst, bonus=bonus)
        except Exception:
            logger.exception("queueing a chained plain burst failed; the chain stops")
            return None

    def _chained_burst(self, chain: PlainBurst) -> list[StepEvent]:
        """A call while a chained burst runs: the rows' next k planned (one burst stale);
        while every row is planned k = 0, the next burst queued behind it; then it is read,
        its steps' events returned (as ``_burst``'s)."""
        rows = chain.rows
        ks = self._spec_tokens(rows)
        nxt = None if any(ks) else self._queue_after(chain)
        self._chain = None
        results = self.runner.plain_collect(chain, overlap=self._overlap, then=nxt)
        self._chain = nxt
        self.step_counts["plain"].add(len(results))
        return self._plain_events(rows, results)

    def _drain_chain(self) -> list[StepEvent]:
        """The chained burst read with none queued behind it (its overlap runs as a step's):
        its steps' events, without the rows that ended in an earlier burst, which are
        released now."""
        chain, self._chain = self._chain, None
        ended, self._chain_ended = self._chain_ended, set()
        if chain is None:
            return []
        results = self.runner.plain_collect(chain, overlap=self._overlap)
        self.step_counts["plain"].add(len(results))
        events = self._plain_events(chain.rows, results, skip=ended)
        for request in sorted(chain.rows, key=lambda r: -r.slot):
            if request.request_id in ended and request.slot >= 0:
                self._release(request)
        return events

    def _device_bursts(self) -> bool:
        """Whether the step just planned is allocated on the device by a runner that can run
        such steps in a burst (one scoring, one budget for the burst: ``spec_steps``)."""
        if not getattr(self.runner, "allocates_in_bursts", False):
            return False
        if not _implements(self.planner, DeviceSlotPlanner):
            return False
        device = cast(DeviceSlotPlanner, self.planner)
        return device.allocates() and device.allocates_on_device()

    def _one_phase(self) -> bool:
        """Whether the planner's step (if any) drafts each row's planned k and verifies it,
        with no allocation after the draft."""
        planner = self.planner
        if _implements(planner, DeviceSlotPlanner):
            device = cast(DeviceSlotPlanner, planner)
            if device.allocates() and device.allocates_on_device():
                return False
        return not (_implements(planner, SlotPlanner) and cast(SlotPlanner, planner).allocates())

    def _burst(
        self, rows: list[Request], spec_tokens: list[int], first: list[torch.Tensor], steps: int
    ) -> list[StepEvent] | None:
        """``steps`` steps of every running row with one host round trip
        (``ModelRunner.plain_steps`` when every row has k = 0, else ``spec_steps``); the events
        of each step in turn, a row's ending with the step that finishes it (its later tokens
        are dropped: scratch). None if the burst raised: the caller then runs one ordinary
        step, whose culprit search finds the row to blame (its first uniforms are ``first``,
        drawn for it; a seeded sampled row's later draws were spent on the failed burst)."""
        plain = not any(spec_tokens)
        try:
            drawn = [first]
            for _ in range(steps - 1):
                drawn.append([self._uniforms(r) for r in rows])
            if all(u is self._greedy_uniforms for step in drawn for u in step):
                uniforms = torch.zeros(steps, len(rows), self._greedy_uniforms.shape[0])
            else:
                uniforms = torch.stack([torch.stack(step) for step in drawn])
            set_ups = self._set_ups()
            scoring = None if plain else self._device_scoring(rows, spec_tokens)
            if plain and self._chains(rows, 0):
                results = self._start_chain(rows, uniforms[:, :, -1])
            elif plain:
                results = self.runner.plain_steps(rows, uniforms, overlap=self._overlap)
            elif scoring is not None:
                results = self.runner.spec_steps(
                    rows, spec_tokens, uniforms, overlap=self._overlap, scoring=scoring
                )
            else:
                results = self.runner.spec_steps(rows, spec_tokens, uniforms, overlap=self._overlap)
        except Exception:
            kind = "plain" if plain else "drafting"
            logger.warning("a burst of %d %s steps failed; stepping once instead", steps, kind)
            return None
        self.step_counts["plain" if plain else "drafting"].add(len(results))
        return self._burst_events(rows, spec_tokens, results, self._set_ups() > set_ups)

    def _set_ups(self) -> int:
        """The runner's first-use set-ups so far (``ModelRunner.lazy_set_ups``; 0 for test
        doubles): a runner call during which they grew paid a one-off cost."""
        return int(getattr(self.runner, "lazy_set_ups", 0))

    def _plain_events(
        self, rows: list[Request], results: list[StepResult], skip: set[str] | None = None
    ) -> list[StepEvent]:
        """A plain burst's events (``skip``: rows whose results are scratch, left out)."""
        if skip:
            kept = [i for i, r in enumerate(rows) if r.request_id not in skip]
            rows = [rows[i] for i in kept]
            results = [_rows_of(result, kept) for result in results]
        return self._burst_events(rows, [0] * len(rows), results)

    def _burst_events(
        self,
        rows: list[Request],
        spec_tokens: list[int],
        results: list[StepResult],
        first_use: bool = False,
    ) -> list[StepEvent]:
        """Each step of a burst in turn, a row's events ending with the step that finishes it
        (its later tokens are scratch); told to the planner while the next step runs.
        ``first_use``: the burst set something up on first use (``StepReport.first_use``)."""
        plain = not any(spec_tokens)
        events: list[StepEvent] = []
        recorded: list[list[StepEvent]] = []
        alive = list(enumerate(rows))
        if results and results[0].on_device:  # each step's scores, in order, for later
            self._defer_scores(rows, results)
        for result in results:
            shared = _plain_report(result) if plain else None
            verified = (result.on_device and result.spec_tokens) or spec_tokens
            stepped = [
                self._postprocess(r, i, verified[i], result, result.on_device, shared, first_use)
                for i, r in alive
            ]
            recorded.append(stepped)
            events += stepped
            alive = [
                (i, r)
                for (i, r), (_, event) in zip(alive, stepped, strict=True)
                if isinstance(event, TokenEvent) and not event.finished
            ]
            if not alive:
                break
        self._unrecorded = recorded  # told to the planner while the next step runs
        self._call_steps = len(recorded)
        return events

    def _device_scoring(
        self, rows: list[Request], drafted: list[int]
    ) -> Callable[[], SlotScoring | None] | None:
        """A two-phase step allocated on the device, when the planner plans one: the planner's
        scoring, which the runner asks for once the draft is queued (a planner that raises
        there is logged, and the step's rows verify what they drafted)."""
        if not _implements(self.planner, DeviceSlotPlanner):
            return None
        planner = cast(DeviceSlotPlanner, self.planner)
        if (
            not planner.allocates()
            or not planner.allocates_on_device()
            or max(drafted, default=0) == 0
        ):
            return None
        views, controllers = self._planned_rows(rows)

        def scoring() -> SlotScoring | None:
            self._tell_scores()  # the previous step's, before this one's scoring is made
            try:
                return planner.slot_scoring(views, controllers, drafted)
            except Exception:
                logger.exception("step planner failed to score a step for the device")
                return None

        return scoring

    def _defer_scores(self, rows: list[Request], results: list[StepResult]) -> None:
        """A device-allocated step's scores (a burst's: each step's) go to its planner later,
        off the path between steps: while the device runs the next step's draft (before that
        step's scoring is made, which they feed) or its verify (``_overlap``), or once no row
        is left. Telling them here, after the step's sync, kept the device idle for the
        planner's learning (vllm-av's estimator: ~0.6 ms a step in a 64-client phase on a
        2-core host). A burst's later steps include rows that finished earlier in it: their
        scratch steps are real drafts and verifies (or draws), told as they ran."""
        self._tell_scores()
        assert _implements(self.planner, DeviceSlotPlanner), "only after a device-allocated step"
        planner = cast(DeviceSlotPlanner, self.planner)
        views, controllers = self._planned_rows(rows)
        self._unscored = (planner, views, controllers, results)

    def _tell_scores(self) -> None:
        """The deferred scores of the last device-allocated step (or burst, step by step), to
        the planner that made them (dropped if the engine's planner was replaced since)."""
        unscored, self._unscored = self._unscored, None
        if unscored is None:
            return
        planner, views, controllers, results = unscored
        if planner is not self.planner:
            return
        try:
            for result in results:
                confidence = result.draft_confidence or [[] for _ in views]
                lengths = [len(tokens) for tokens in result.new_tokens]
                verified = result.spec_tokens or [0] * len(views)
                planner.scored_on_device(views, controllers, confidence, verified, lengths)
        except Exception:
            logger.exception("step planner failed to take a device-allocated step's scores")

    def _planned_rows(self, rows: list[Request]) -> tuple[list[RequestView], list[SpecController]]:
        by_id = {view.request_id: view for view in self._planned[0]}
        return [by_id[r.request_id] for r in rows], [r.controller for r in rows]

    def _allocation(self, rows: list[Request]) -> Allocate | None:
        """A two-phase step's allocation, when the planner asks for one: each row's k from
        its draft confidence. A planner that raises keeps every row at what it drafted
        (logged); answers are clamped to [0, drafted]."""
        if not _implements(self.planner, SlotPlanner):
            return None
        planner = cast(SlotPlanner, self.planner)
        if not planner.allocates():
            return None
        views, controllers = self._planned_rows(rows)

        def allocate(confidence: list[PositionValues]) -> list[int]:
            drafted = [len(c) for c in confidence]
            try:
                wanted = [int(k) for k in planner.allocate(views, controllers, confidence)]
                if len(wanted) != len(rows):
                    raise ValueError(f"planner allocated {len(wanted)} k for {len(rows)} rows")
            except Exception:
                logger.exception("step planner failed to allocate; verifying what was drafted")
                return drafted
            return [max(0, min(k, d)) for k, d in zip(wanted, drafted, strict=True)]

        return allocate

    def _before_allocation(self, rows: list[Request]) -> Callable[[], None] | None:
        """The planner's confidence-free part of the allocation, which the runner runs while
        the device drafts (a planner that raises there is logged; ``allocate`` then decides
        the whole step)."""
        if not _implements(self.planner, PreparesAllocation):
            return None
        planner = cast(PreparesAllocation, self.planner)
        views, controllers = self._planned_rows(rows)

        def before() -> None:
            try:
                planner.prepare_allocation(views, controllers)
            except Exception:
                logger.exception("step planner failed to prepare an allocation")

        return before

    def _overlap(self) -> None:
        """Host work hidden behind the device's step (runner.step calls it before its sync):
        the previous step's results to the planner, and the next step prepared from what is
        known now (one step stale; the planner decides whether to use it)."""
        self._tell_scores()
        self._tell_planner()
        if self.planner is None:
            return
        try:
            self.planner.prepare(*self._planned)
        except Exception:
            logger.exception("step planner failed to prepare a step")

    def _tell_planner(self) -> None:
        """The planner learns what its last step did (a planner that raises is logged, only)."""
        steps, self._unrecorded = self._unrecorded, []
        if self.planner is None:
            return
        for stepped in steps:
            if not stepped:
                continue
            done = [(r.controller, e.report) for r, e in stepped if isinstance(e, TokenEvent)]
            reports = [report for _, report in done if report is not None]
            try:
                self.planner.record([c for c, report in done if report is not None], reports)
            except Exception:
                logger.exception("step planner failed to record a step")

    def _find_culprit(
        self,
        rows: list[Request],
        spec_tokens: list[int],
        uniforms: torch.Tensor,
        error: Exception,
    ) -> tuple[Request, Exception]:
        """The row whose joining makes the step raise, by bisecting prefixes of the batch
        (the runner's rows must be slots 0..n-1, and a prefix is): log2(batch) probe steps.

        Invariant: a step of ``rows[:good]`` succeeds and one of ``rows[:bad]`` raises
        ``error``, so ``rows[bad - 1]`` is to blame. This needs the failure to be
        deterministic, not monotone in the batch.

        Re-running steps is safe for the KV caches. A step writes a row's target and draft K/V
        only at positions >= ``row.position`` (verify: ``[position, position + width)``; draft
        block: ``[position, position + block)``), and those positions are scratch: a row's
        position advances only in ``_postprocess`` (``Request.append``), and every forward
        writes the positions its queries may read (>= position) before attending to them
        (causal mask in the verify, ``< position + block`` in the draft). So a failed or
        discarded step leaves nothing a later step reads, and the final step reproduces the
        tokens the first attempt would have given. Probes run eagerly (``eager=True``) so
        they write only their own rows' slots: a CUDA-graph replay padded to a captured batch
        size would also write stale inputs into the following slots, which hold live rows here.
        """
        good, bad = 0, len(rows)
        while bad - good > 1:
            middle = (good + bad) // 2
            try:
                self.runner.step(rows[:middle], spec_tokens[:middle], uniforms[:middle], eager=True)
                good = middle
            except Exception as exc:
                bad, error = middle, exc
        return rows[bad - 1], error

    def _postprocess(
        self,
        request: Request,
        index: int,
        spec_tokens: int,
        result: StepResult,
        two_phase: bool = False,
        plain: StepReport | None = None,
        first_use: bool = False,
    ) -> StepEvent:
        """``plain``: a plain step's report, the same for every row (k = 0, one token, no
        drafts: built once per step instead of once per row). ``first_use``: the runner call
        set something up on first use (``StepReport.first_use``; plain steps never do)."""
        try:
            report = plain or StepReport(
                spec_tokens=spec_tokens,
                accept_length=len(result.new_tokens[index]),
                accepted=result.accepted[index],
                step_time_s=result.step_time_s,
                batch_size=len(result.new_tokens),
                draft_confidence=(
                    () if result.draft_confidence is None else tuple(result.draft_confidence[index])
                ),
                two_phase=two_phase,
                first_use=first_use,
            )
            request.accept_lengths.append(report.accept_length)
            request.spec_tokens.append(report.spec_tokens)
            return request, self._event(request, result.new_tokens[index], report)
        except Exception as exc:
            return request, self._failed(request, "postprocess", exc)

    def _event(self, request: Request, tokens: list[int], report: StepReport | None) -> TokenEvent:
        kept = request.append(tokens)
        reason = request.finish_reason
        return TokenEvent(kept, report, reason is not None, reason)

    def _failed(self, request: Request, stage: FailureStage, exc: Exception) -> RequestFailed:
        logger.error("request %s failed in %s", request.request_id, stage, exc_info=exc)
        failure = RequestFailed(request.request_id, stage, f"{type(exc).__name__}: {exc}")
        failure.__cause__ = exc
        return failure

    def _release_ended(self, events: list[StepEvent]) -> None:
        """Release finished and failed requests, highest slot first: fewest cache moves (a row
        of a chained burst still running waits for it to be read: ``_chain_ended``)."""
        chained = {id(r) for r in self._chain.rows} if self._chain is not None else set()
        for request, event in sorted(events, key=lambda e: -e[0].slot):
            is_ended = isinstance(event, RequestFailed) or event.finished
            if is_ended and request.slot >= 0:
                if id(request) in chained:
                    self._chain_ended.add(request.request_id)
                else:
                    self._release(request)

    def _release(self, request: Request) -> None:
        moved = self.scheduler.release(request)
        if moved is not None:
            mover = self.scheduler.running[moved[1]]
            self.runner.release_slot(moved, mover.position)
        self._generators.pop(request.request_id, None)

    def _spec_tokens(self, rows: list[Request]) -> list[int]:
        """k per row: from the planner (one call) or each row's controller, clamped to the
        row's ``max_spec_tokens``. A planner or controller that raises gives k = 0 (logged once
        per request, counted in ``num_controller_failures``, never fatal): k only changes
        speed, not tokens."""
        views = [self._view(r, len(rows)) for r in rows]
        self._planned = (views, [r.controller for r in rows])
        if self.planner is not None:
            try:
                wanted = [int(k) for k in self.planner.plan(views, [r.controller for r in rows])]
                if len(wanted) != len(rows):
                    raise ValueError(f"planner gave {len(wanted)} k for {len(rows)} rows")
            except Exception:
                logger.exception("step planner failed; drafting off for this step")
                wanted = [0] * len(rows)
        else:
            wanted = [self._ask(r, v) for r, v in zip(rows, views, strict=True)]
        return [
            clamp_spec_tokens(k, 1, v.max_spec_tokens) for k, v in zip(wanted, views, strict=True)
        ]

    def _view(self, request: Request, batch_size: int) -> RequestView:
        return RequestView(
            request_id=request.request_id,
            step_index=len(request.accept_lengths),
            accept_lengths=request.accept_lengths,
            batch_size=batch_size,
            num_generated=len(request.output_ids),
            context=request.context,
            spec_tokens=request.spec_tokens,
            max_spec_tokens=min(max_spec_tokens(self.block_size), request.num_remaining - 1),
            num_remaining=request.num_remaining,
        )

    def _ask(self, request: Request, view: RequestView) -> int:
        try:
            return int(request.controller(view))
        except Exception:
            request.num_controller_failures += 1
            if request.num_controller_failures == 1:  # a broken policy raises every step
                logger.exception(
                    "spec controller failed for request %s; using k=0", request.request_id
                )
            return 0

    def _uniforms(self, request: Request) -> torch.Tensor:
        """2 * block_size + 1 uniforms: draft sampling, accept tests, bonus (greedy: zeros)."""
        if request.params.temperature <= 0:
            return self._greedy_uniforms
        size = 2 * self.block_size + 1
        generator = self._generators.get(request.request_id, self._shared_generator)
        return torch.rand(size, generator=generator)


def _rows_of(result: StepResult, kept: list[int]) -> StepResult:
    """A plain step's result for the rows at ``kept`` only."""
    return StepResult(
        [result.accepted[i] for i in kept],
        [result.new_tokens[i] for i in kept],
        result.step_time_s,
        None,
        [0] * len(kept),
    )


def _plain_report(result: StepResult) -> StepReport:
    """The report of every row of a plain step (each emitted one token, drafted nothing)."""
    return StepReport(
        spec_tokens=0,
        accept_length=1,
        accepted=[],
        step_time_s=result.step_time_s,
        batch_size=len(result.new_tokens),
    )


def _is_token(value: object, vocab_size: int) -> bool:
    return type(value) is int and 0 <= value < vocab_size
