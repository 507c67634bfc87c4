"""Which step mode pays on this engine, measured: one phase (one shared k, verified padded) or
two phases (every row drafts, then each row's k from its draft confidence, verified ragged).

A two-phase step spends host time between draft and verify (the confidence crosses to the
host, the allocator runs, the verify is launched) and a ragged verify has overheads of its
own; what it saves depends on the GPU, the model, the batch and the traffic. On the H200 8B
shape its 64-row steps took 1.10-1.16x a one-phase k = 7 step while verifying ~17% fewer
tokens (docs/allocator.md), so a fixed mode loses somewhere. ``StepModeChooser`` measures
instead: per batch-size bucket (rows rounded up to a power of two) it keeps the tokens each
mode emitted per second of step time (decayed sums), tries both modes in alternating blocks
of ``probe_steps`` steps until each has ``learn_steps`` measured steps, then runs the faster
(the incumbent keeps its place unless the other is ``margin`` faster) and re-measures the
other for one block every ``reprobe_steps`` decided steps, so it follows the traffic.

Pure: no clock, no I/O; the caller records each step's mode, emitted tokens and seconds.
``peek`` answers without advancing the schedule (an engine prepares the next step before it
plans it); ``decide`` advances it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModeSettings:
    probe_steps: int = 8  # steps of one mode in a row while measuring
    learn_steps: int = 16  # measured steps of each mode before the faster one is run
    reprobe_steps: int = 512  # decided steps between two re-measurements of the other mode
    margin: float = 0.02  # the other mode must be this much faster to take over
    decay: float = 0.995  # per recorded step of a bucket: old steps fade (traffic changes)

    def __post_init__(self) -> None:
        if self.probe_steps < 1 or self.learn_steps < 1 or self.reprobe_steps < 1:
            raise ValueError("probe_steps, learn_steps and reprobe_steps must be >= 1")
        if self.margin < 0 or not 0 < self.decay <= 1:
            raise ValueError("margin must be >= 0 and decay in (0, 1]")


@dataclass
class _Bucket:
    tokens: list[float] = field(default_factory=lambda: [0.0, 0.0])  # [one-phase, two-phase]
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])
    steps: list[int] = field(default_factory=lambda: [0, 0])  # measured, undecayed
    decided: int = 0  # steps decided in this bucket
    incumbent: bool | None = None  # the mode run outside probes, once learnt

    def rate(self, two_phase: bool) -> float | None:
        i = int(two_phase)
        return self.tokens[i] / self.seconds[i] if self.seconds[i] > 0 else None


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
        self._update_incumbent(state)

    def rates(self, rows: int) -> tuple[float | None, float | None]:
        """Measured tokens per second (one-phase, two-phase) of the bucket of ``rows``."""
        state = self._buckets.get(self.bucket(rows)) or _Bucket()
        return state.rate(False), state.rate(True)

    def incumbent(self, rows: int) -> bool | None:
        """The mode the bucket of ``rows`` runs outside probes (True: two-phase); None while
        it is still learning."""
        state = self._buckets.get(self.bucket(rows))
        return None if state is None else state.incumbent

    def buckets(self) -> list[tuple[int, bool | None, float | None, float | None]]:
        """Every bucket seen: (rows up to, mode run outside probes or None while learning,
        one-phase tok/s, two-phase tok/s). Safe to call from another thread (a snapshot)."""
        return [
            (bucket, state.incumbent, state.rate(False), state.rate(True))
            for bucket, state in sorted(list(self._buckets.items()))
        ]

    def describe(self, rows: int) -> str:
        """A line for people: the bucket's measured rates and the mode it runs."""
        one, two = self.rates(rows)
        state = self._buckets.get(self.bucket(rows)) or _Bucket()
        runs = {None: "learning", False: "one-phase", True: "two-phase"}[state.incumbent]
        show = [f"{x:.0f}" if x is not None else "?" for x in (one, two)]
        return (
            f"step mode for <= {self.bucket(rows)} rows: {runs} "
            f"(tok/s one-phase {show[0]}, two-phase {show[1]})"
        )

    def _choice(self, state: _Bucket) -> bool:
        s = self.settings
        if state.incumbent is None:  # learning: alternate blocks, two-phase first
            return (state.decided // s.probe_steps) % 2 == 0
        cycle = s.reprobe_steps + s.probe_steps
        probing = state.decided % cycle >= s.reprobe_steps
        return state.incumbent != probing

    def _update_incumbent(self, state: _Bucket) -> None:
        if min(state.steps) < self.settings.learn_steps:
            return
        one, two = state.rate(False), state.rate(True)
        if one is None or two is None:
            return
        if state.incumbent is None:
            state.incumbent = two > one
            return
        mine, other = (two, one) if state.incumbent else (one, two)
        if other > mine * (1.0 + self.settings.margin):
            state.incumbent = not state.incumbent
