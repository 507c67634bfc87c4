"""Which step mode pays on this engine, measured: one phase (one shared k, verified padded) or
two phases (every row drafts, then each row's k from its draft confidence, verified ragged).

A two-phase step spends host time between draft and verify (the confidence crosses to the
host, the allocator runs, the verify is launched) and a ragged verify has overheads of its
own; what it saves depends on the GPU, the model, the batch and the traffic. On the H200 8B
shape its 64-row steps took 1.10-1.16x a one-phase k = 7 step while verifying ~17% fewer
tokens (docs/allocator.md), so a fixed mode loses somewhere. ``StepModeChooser`` measures
instead: per batch-size bucket (rows rounded up to a power of two) it tries both modes in
alternating blocks of ``probe_steps`` steps until each has ``learn_steps`` measured steps,
then runs the faster (the incumbent keeps its place unless the other is ``margin`` faster)
and re-measures the other for one block every ``reprobe_steps`` decided steps, so it follows
the traffic.

Optionally (``cut_ratio`` > 0, session 52; off by default) a block that loses by far is cut
short: once a block of the mode being tried (while learning, or a re-probe) has run
``cut_steps`` steps each under ``cut_ratio`` of the rate of the other mode's block just before
it, it ends there, and while the bucket learns a paired estimate that far apart decides it at
once, before ``learn_steps``; learning then starts with one phase, so the first two-phase block
has a measured block before it. Built for the real pair's draining 64-row bucket (call s52a:
9-17 two-phase learning steps a run at 6-14 tokens a ms against ~29 for plain and one-phase
steps, 1.5-3% of the mixed phase); measured on three calls it changed nothing outside the
noise, and on the compiled 8B arm it decided the 64-row bucket one-phase from two slow
first-use steps of the warm pass (paired 0.495x), so it stays off (docs/ragged-log.md
"Session 52").

"Faster" is judged on paired blocks only: each time the recorded mode changes, the last
``probe_steps`` steps before the change and the first ``probe_steps`` after it (tokens
emitted per second of step time in each) give one paired log ratio, and the estimate is their
mean weighted by ``pair_decay`` per pair made since. A probe is so compared
with the incumbent's steps just before it and just after it, under the same traffic. Until
session 17 the two modes' rates were pooled over whatever steps each had run, and a bucket
compared the incumbent's current rate with the other mode's rate from minutes before: in a
closed loop the running mix drifts (requests that accept long runs finish first), so the
incumbent's rate fell below the other's stale one and the bucket flipped to the slower mode
(cold H200 runs spent 21-98 of ~180 64-row steps in two-phase, 3-9% slower), or came out of
a warm-up on the slower mode and kept it (the A/A twin of docs/ragged-log.md "Warm
policies"). The pooled rates are still kept, for people (``rates``, ``describe``, the dashboard).

Pure: no clock, no I/O; the caller records each step's mode, emitted tokens and seconds.
``peek`` answers without advancing the schedule (an engine prepares the next step before it
plans it); ``decide`` advances it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from policies.model import GoodputSpec


@dataclass(frozen=True)
class ModeSettings:
    probe_steps: int = 8  # steps of one mode in a row while measuring
    learn_steps: int = 16  # measured steps of each mode before the faster one is run
    reprobe_steps: int = 512  # decided steps between two re-measurements of the other mode
    margin: float = 0.02  # the other mode must be this much faster to take over
    decay: float = 0.995  # per recorded step of a bucket: old steps fade (traffic changes)
    pair_decay: float = 0.8  # per new paired comparison: the older pairs' weight
    # A tried block under this share of the block before it is cut after ``cut_steps`` steps
    # and decides a learning bucket (0, the default: never; learning starts two-phase)
    cut_ratio: float = 0.0
    cut_steps: int = 2

    def __post_init__(self) -> None:
        if self.probe_steps < 1 or self.learn_steps < 1 or self.reprobe_steps < 1:
            raise ValueError("probe_steps, learn_steps and reprobe_steps must be >= 1")
        if self.margin < 0 or not 0 < self.decay <= 1 or not 0 < self.pair_decay <= 1:
            raise ValueError("margin must be >= 0, decay and pair_decay in (0, 1]")
        if not 0 <= self.cut_ratio < 1 or self.cut_steps < 1:
            raise ValueError("cut_ratio must be in [0, 1) and cut_steps >= 1")

    @classmethod
    def of(cls, goodput: GoodputSpec) -> ModeSettings:
        """The goodput policy's ``mode_*`` settings (the engine's chooser and the simulator's
        read the same)."""
        return cls(
            probe_steps=goodput.mode_probe_steps,
            learn_steps=goodput.mode_learn_steps,
            reprobe_steps=goodput.mode_reprobe_steps,
            margin=goodput.mode_margin,
            cut_ratio=goodput.mode_cut_ratio,
        )


@dataclass
class _Bucket:
    tokens: list[float] = field(default_factory=lambda: [0.0, 0.0])  # [one-phase, two-phase]
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])
    steps: list[int] = field(default_factory=lambda: [0, 0])  # measured, undecayed
    decided: int = 0  # steps decided in this bucket
    incumbent: bool | None = None  # the mode run outside probes, once learnt
    # The current run of one recorded mode: its mode and its last ``probe_steps`` steps.
    run_mode: bool | None = None
    recent: deque[tuple[float, float]] = field(default_factory=deque)
    # Since the last change of mode: the steps before it (tokens, seconds, mode) and the
    # tokens, seconds and steps after it so far; None once that pair is made.
    before: tuple[float, float, bool] | None = None
    after: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    # Paired log(two-phase rate / one-phase rate): decayed weighted sum, weights, pairs made.
    log_ratio: float = 0.0
    weight: float = 0.0
    pairs: int = 0

    def rate(self, two_phase: bool) -> float | None:
        i = int(two_phase)
        return self.tokens[i] / self.seconds[i] if self.seconds[i] > 0 else None

    def advantage(self) -> float | None:
        """Paired estimate of log(two-phase tok/s / one-phase tok/s); None before a pair."""
        return self.log_ratio / self.weight if self.weight > 0 else None


# A bucket's incumbent (``BucketView.incumbent``) in words, for people.
MODE_NAMES: dict[bool | None, str] = {None: "learning", False: "one-phase", True: "two-phase"}


class BucketView(NamedTuple):
    """One batch-size bucket of the chooser, for people (metrics, dashboards)."""

    rows: int  # rows up to (a power of two)
    incumbent: bool | None  # two-phase outside probes; None while learning
    one_phase_tok_s: float | None  # pooled over the mode's own steps (decayed)
    two_phase_tok_s: float | None
    # Two-phase tok/s over one-phase tok/s in paired blocks (the steps just before and after
    # each change of mode): what the bucket's mode is chosen on; None before the first pair.
    paired_ratio: float | None
    pairs: int


class StepModeChooser:
    def __init__(self, settings: ModeSettings | None = None) -> None:
        self.settings = settings or ModeSettings()
        self._buckets: dict[int, _Bucket] = {}

    @staticmethod
    def bucket(rows: int) -> int:
        """Rows rounded up to a power of two (1, 2, 4, ..., 64, 128)."""
        return 1 << max(0, rows - 1).bit_length()

    def peek(self, rows: int) -> bool:
        """Whether the next step of ``rows`` rows would be two-phase (no state changes)."""
        return self._choice(self._buckets.get(self.bucket(rows)) or _Bucket())

    def decide(self, rows: int) -> bool:
        """Whether this step of ``rows`` rows is two-phase (advances the bucket's schedule)."""
        state = self._buckets.setdefault(self.bucket(rows), _Bucket())
        choice = self._choice(state)
        state.decided += 1
        return choice

    def record(self, rows: int, two_phase: bool, tokens: int, seconds: float) -> None:
        """A step that ran: its mode, the tokens its rows emitted (bonus included), its time."""
        if seconds <= 0:
            return
        state = self._buckets.setdefault(self.bucket(rows), _Bucket())
        decay, i = self.settings.decay, int(two_phase)
        for j in (0, 1):
            state.tokens[j] *= decay
            state.seconds[j] *= decay
        state.tokens[i] += tokens
        state.seconds[i] += seconds
        state.steps[i] += 1
        if self._pair(state, two_phase, tokens, seconds):
            self._update_incumbent(state)
        elif self._losing_by_far(state, two_phase):
            self._cut(state)

    def _losing_by_far(self, state: _Bucket, two_phase: bool) -> bool:
        """The block of ``two_phase`` under way is one being tried (learning, or a re-probe
        of the mode that is not the incumbent), is still scheduled, has run ``cut_steps`` steps
        and emits under ``cut_ratio`` of the rate of the other mode's block just before it."""
        s = self.settings
        if s.cut_ratio <= 0 or state.before is None or state.incumbent == two_phase:
            return False
        tokens, seconds, _ = state.before
        if state.after[2] < s.cut_steps or min(tokens, seconds) <= 0:
            return False
        bar = s.cut_ratio * tokens / seconds  # every one of the last cut_steps under it: a
        last = list(state.recent)[-s.cut_steps :]  # one-off stall does not cut a block
        slower = all(t < bar * sec for t, sec in last)
        return slower and self._choice(state) == two_phase

    def _cut(self, state: _Bucket) -> None:
        """End the block under way: pair it as it is and move the schedule to the next block
        (learning) or past the re-probe (decided)."""
        s = self.settings
        if self._add_pair(state):
            advantage = state.advantage()
            if (
                state.incumbent is None
                and advantage is not None
                and abs(advantage) > -math.log(s.cut_ratio)
            ):  # that far apart: decided now, before learn_steps
                state.incumbent = advantage > 0
            else:
                self._update_incumbent(state)
        if state.incumbent is None:
            state.decided = (state.decided // s.probe_steps + 1) * s.probe_steps
        else:
            cycle = s.reprobe_steps + s.probe_steps
            state.decided = (state.decided // cycle + 1) * cycle

    def _pair(self, state: _Bucket, two_phase: bool, tokens: int, seconds: float) -> bool:
        """Track runs of one mode; True when this step completes a pair of blocks around a
        change of mode (the step after ``probe_steps`` of the new mode, or a change before)."""
        made = False
        if state.run_mode is not None and two_phase != state.run_mode:
            if state.before is not None and state.after[2] > 0:  # the mode changed back early
                made = self._add_pair(state)
            state.before = (
                sum(t for t, _ in state.recent),
                sum(s for _, s in state.recent),
                state.run_mode,
            )
            state.after = [0.0, 0.0, 0.0]
            state.recent.clear()
        state.run_mode = two_phase
        state.recent.append((float(tokens), seconds))
        if len(state.recent) > self.settings.probe_steps:
            state.recent.popleft()
        if state.before is not None:
            state.after[0] += tokens
            state.after[1] += seconds
            state.after[2] += 1
            if state.after[2] >= self.settings.probe_steps:
                made = self._add_pair(state) or made
        return made

    def _add_pair(self, state: _Bucket) -> bool:
        assert state.before is not None
        tokens, seconds, before_two = state.before
        after_tokens, after_seconds, _ = state.after
        state.before = None
        if min(tokens, after_tokens) <= 0 or min(seconds, after_seconds) <= 0:
            return False  # a block that emitted nothing: no ratio
        ratio = math.log((after_tokens / after_seconds) / (tokens / seconds))
        keep = self.settings.pair_decay
        state.log_ratio = keep * state.log_ratio + (-ratio if before_two else ratio)
        state.weight = keep * state.weight + 1.0
        state.pairs += 1
        return True

    def rates(self, rows: int) -> tuple[float | None, float | None]:
        """Measured tokens per second (one-phase, two-phase) of the bucket of ``rows``."""
        state = self._buckets.get(self.bucket(rows)) or _Bucket()
        return state.rate(False), state.rate(True)

    def incumbent(self, rows: int) -> bool | None:
        """The mode the bucket of ``rows`` runs outside probes (True: two-phase); None while
        it is still learning."""
        state = self._buckets.get(self.bucket(rows))
        return None if state is None else state.incumbent

    def buckets(self) -> list[BucketView]:
        """Every bucket seen (``BucketView``). Safe to call from another thread (a snapshot)."""
        out = []
        for bucket, state in sorted(list(self._buckets.items())):
            advantage = state.advantage()
            paired = None if advantage is None else math.exp(advantage)
            view = BucketView(
                bucket, state.incumbent, state.rate(False), state.rate(True), paired, state.pairs
            )
            out.append(view)
        return out

    def describe(self, rows: int) -> str:
        """A line for people: the bucket's measured rates and the mode it runs."""
        one, two = self.rates(rows)
        state = self._buckets.get(self.bucket(rows)) or _Bucket()
        runs = MODE_NAMES[state.incumbent]
        show = [f"{x:.0f}" if x is not None else "?" for x in (one, two)]
        advantage = state.advantage()
        paired = "?" if advantage is None else f"{math.exp(advantage):.3f}x"
        return (
            f"step mode for <= {self.bucket(rows)} rows: {runs} "
            f"(tok/s one-phase {show[0]}, two-phase {show[1]}; two-phase over one-phase in "
            f"paired blocks {paired}, {state.pairs} pairs)"
        )

    def advantage(self, rows: int) -> float | None:
        """The bucket's paired estimate of two-phase tok/s over one-phase tok/s (a ratio);
        None before its first pair."""
        state = self._buckets.get(self.bucket(rows))
        advantage = None if state is None else state.advantage()
        return None if advantage is None else math.exp(advantage)

    def _choice(self, state: _Bucket) -> bool:
        s = self.settings
        if state.incumbent is None:  # learning: alternate blocks, one phase first with the cut
            return (state.decided // s.probe_steps) % 2 == int(s.cut_ratio > 0)
        cycle = s.reprobe_steps + s.probe_steps
        probing = state.decided % cycle >= s.reprobe_steps
        return state.incumbent != probing

    def _update_incumbent(self, state: _Bucket) -> None:
        """After a new pair: once both modes are learnt, the mode the paired estimate favours
        (the incumbent stays unless the other is ``margin`` faster)."""
        advantage = state.advantage()
        if min(state.steps) < self.settings.learn_steps or advantage is None:
            return
        if state.incumbent is None:
            state.incumbent = advantage > 0
            return
        gain = -advantage if state.incumbent else advantage  # the other mode's, log
        if gain > math.log1p(self.settings.margin):
            state.incumbent = not state.incumbent
