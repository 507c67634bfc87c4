"""Step cost T(batch, k): a profiled table, interpolated, padded and refined online.

The table (``cost_tables/*.json``) holds the engine's measured time of one target forward
with ``tokens_per_request`` new tokens for each of ``batch_sizes`` requests. A verify step
with k drafted tokens has width k + 1; engines that replay captured shapes pad that width up
to a multiple (``verify_width_multiple``, 8 on the H200 notes: T = 5 and 9 cost more than 8
and 16). A step that drafts also pays the draft forward, modelled as ``draft_cost_fraction``
of a target forward at the full block width, unless the table's times are whole engine
steps (``includes_draft``: the embedded engine's start-up profile).

Online refinement, at two levels per batch size row of the table:

- the row: observed step times are regressed on the table's prediction,
  ``observed ~ scale x predicted + overhead`` (exponentially weighted). Once a row has seen
  steps of clearly different predicted cost (e.g. plain and drafting steps) the fit separates
  a per-step host overhead, which scales nothing, from a factor on the forward; until then, or
  when the fit is implausible, the overhead is 0 and the scale is the ratio of means. A
  configured host overhead (``prior_overhead_s`` + batch size x
  ``prior_overhead_per_request_s``: scheduling, sampling, the policy's own time, which the
  table's graph-replay times leave out) stands in until a row's fit separates one of its own;
- each padded width of the row: the ratio of observed to table time of the steps at that
  width (exponentially weighted, ``WidthFit``), which replaces the row's scale and overhead
  for that width as its steps accumulate. A row's fit is one line through all widths and
  cannot price what the table gets wrong between two widths: on the H200 the table put width
  16 at 1.015x width 8 at batch 1 where the engine's steps took 1.072x, and no scale and
  overhead fit both.

Predictions interpolate between rows. Plain data: files are read by
``engines.cost_tables.load_cost_table``, never by a policy.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CostTable:
    """step_time_s[b][t]: seconds for batch_sizes[b] requests x tokens_per_request[t] tokens."""

    batch_sizes: tuple[int, ...]
    tokens_per_request: tuple[int, ...]
    step_time_s: tuple[tuple[float, ...], ...]
    shape: str = ""
    device: str = ""
    source: str = ""
    # True: each time is a whole engine step (draft forward, sampling and host work included,
    # e.g. the embedded engine's start-up profile), so no draft term is added on top.
    includes_draft: bool = False
    # Whole drafting steps measured at the engine's captured token counts, per batch size:
    # ((batch, ((tokens, seconds), ...)), ...), both ascending. A GPU's verify climbs in
    # stairs between the table's widths (its matrix products run in tiles), and a ragged step
    # runs the smallest captured count >= its tokens; ``TableRaggedCost`` prices with them.
    token_buckets: tuple[tuple[int, tuple[tuple[int, float], ...]], ...] = ()

    def __post_init__(self) -> None:
        _check_axis("batch_sizes", self.batch_sizes)
        _check_axis("tokens_per_request", self.tokens_per_request)
        if len(self.step_time_s) != len(self.batch_sizes):
            raise ValueError(
                f"step_time_s has {len(self.step_time_s)} rows but there are "
                f"{len(self.batch_sizes)} batch_sizes"
            )
        for b, row in zip(self.batch_sizes, self.step_time_s, strict=True):
            if len(row) != len(self.tokens_per_request) or any(t <= 0 for t in row):
                raise ValueError(
                    f"step_time_s row for batch {b} must hold {len(self.tokens_per_request)} "
                    "positive times (one per tokens_per_request)"
                )
        batches = [b for b, _ in self.token_buckets]
        if any(b <= a for a, b in itertools.pairwise(batches)):
            raise ValueError(f"token_buckets batch sizes must be strictly ascending, got {batches}")
        for b, points in self.token_buckets:
            tokens = [n for n, _ in points]
            if not points or any(n <= m for m, n in itertools.pairwise(tokens)):
                raise ValueError(f"token_buckets of batch {b}: token counts must ascend")
            if b < 1 or tokens[0] < b or any(t <= 0 for _, t in points):
                raise ValueError(
                    f"token_buckets of batch {b}: need batch >= 1, tokens >= the batch and "
                    "positive times"
                )

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> CostTable:
        """Build from the cost table JSON format; raises ValueError naming the bad field."""
        missing = [k for k in ("batch_sizes", "tokens_per_request", "step_time_s") if k not in data]
        if missing:
            raise ValueError(f"cost table {source or '<data>'}: missing keys {missing}")
        if data.get("unit", "s") != "s":
            raise ValueError(f"cost table {source}: unit must be 's', got {data['unit']!r}")
        return cls(
            batch_sizes=tuple(int(b) for b in data["batch_sizes"]),
            tokens_per_request=tuple(int(t) for t in data["tokens_per_request"]),
            step_time_s=tuple(tuple(float(x) for x in row) for row in data["step_time_s"]),
            shape=str(data.get("shape", "")),
            device=str(data.get("device", "")),
            source=source,
            includes_draft=bool(data.get("includes_draft", False)),
            token_buckets=tuple(
                (int(b), tuple((int(n), float(t)) for n, t in points))
                for b, points in data.get("token_buckets", [])
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """The cost table JSON format (what ``from_dict`` reads)."""
        return {
            "shape": self.shape,
            "device": self.device,
            "unit": "s",
            "batch_sizes": list(self.batch_sizes),
            "tokens_per_request": list(self.tokens_per_request),
            "step_time_s": [list(row) for row in self.step_time_s],
            "includes_draft": self.includes_draft,
            **(
                {
                    "token_buckets": [
                        [b, [list(p) for p in points]] for b, points in self.token_buckets
                    ]
                }
                if self.token_buckets
                else {}
            ),
        }

    def time_s(self, batch_size: float, tokens: float) -> float:
        """Bilinear interpolation; linear extrapolation past the largest batch or width."""
        bi, bw = _bracket(self.batch_sizes, batch_size)
        ti, tw = _bracket(self.tokens_per_request, tokens)
        rows = self.step_time_s

        def at(b: int) -> float:
            return rows[b][ti] + tw * (rows[b][ti + 1] - rows[b][ti])

        value = at(bi) + bw * (at(bi + 1) - at(bi))
        return max(value, 1e-9)


def _check_axis(name: str, values: Sequence[int]) -> None:
    if len(values) < 2 or any(v < 1 for v in values):
        raise ValueError(f"{name} needs at least two values >= 1, got {list(values)}")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"{name} must be strictly ascending, got {list(values)}")


def _bracket(axis: Sequence[int], x: float) -> tuple[int, float]:
    """Index i and weight w so that x ~ axis[i] + w * (axis[i+1] - axis[i]); w may be > 1."""
    x = max(float(axis[0]), x)
    i = min(max(bisect.bisect_right(axis, x) - 1, 0), len(axis) - 2)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


def padded_width(spec_tokens: int, multiple: int) -> int:
    """Verify width (k + 1) rounded up to the engine's captured widths; 1 when k = 0."""
    width = spec_tokens + 1
    if spec_tokens <= 0 or multiple <= 1:
        return max(1, width)
    return int(math.ceil(width / multiple) * multiple)


# (factor, added seconds) per captured width at one row; see ``CostModel._terms``.
Terms = tuple[tuple[float, ...], tuple[float, ...]]
# (table seconds, lower row, weight of the upper row, width index); see ``CostModel.layout``.
Layout = tuple[float, int, float, int]

# The overhead is fitted only once a row's predictions spread by this fraction of their mean
# and it has seen this many observations (fractional when a step falls between two rows).
_MIN_SPREAD = 0.05
_MIN_OBSERVATIONS = 20.0
# A width counts as seen at a row once its own steps make up this much of its fit (a
# ``WidthFit`` weight: about 14 steps at the default learning rate of 0.05).
_SEEN_WIDTH_WEIGHT = 0.5
# A step observed at more than this many times its current price (once its row's fit has
# this many observations) is folded in at that multiple: one stall -- a collector's pause,
# host work the step's sync waited for -- otherwise sets a width's price for the ~14 steps its
# fit takes to forget it, and a width priced far too high is not run again to correct it (what
# a mispriced plain width did to the real pair in calls s41b and s42b, there from steady
# steps: two-phase steps recorded as plain, see ``_drafting_width``). A real change of speed
# still gets in, at most (multiple - 1) x the learning rate a step.
_STALL_MULTIPLE = 3.0
_CLIP_AFTER = 5.0
# A width's own fit fades once its row has run this many steps at other widths since its own
# last one: its weight (and sums, so its ratio stays) halves every ``_WIDTH_HALF_LIFE_STEPS``
# more, and the row's fit takes over its price again (widths in use keep their fits whole).
# A width priced out of use by steps that no longer hold would otherwise keep that price for
# good: in the real pair's call s42b the plain width at the row of 64 learnt 3.36x the table
# from 16 steps of the warm pass (4.3-4.5 ms) and no plain step ran at 64 rows again in the
# three timed runs, where no-spec's took 1.5 ms.
_WIDTH_GRACE_STEPS = 50.0
_WIDTH_HALF_LIFE_STEPS = 50.0
_AGE_PER_STEP = math.log(2.0) / _WIDTH_HALF_LIFE_STEPS
_GRACE = _AGE_PER_STEP * _WIDTH_GRACE_STEPS


@dataclass
class RowFit:
    """Exponentially weighted least squares of observed on predicted step time for one row."""

    count: float = 0.0
    weight: float = 0.0
    sum_x: float = 0.0
    sum_y: float = 0.0
    sum_xx: float = 0.0
    sum_xy: float = 0.0

    def add(self, predicted_s: float, observed_s: float, rate: float, share: float) -> None:
        self.count += share
        keep = 1.0 - rate
        self.weight = keep * self.weight + rate
        self.sum_x = keep * self.sum_x + rate * predicted_s
        self.sum_y = keep * self.sum_y + rate * observed_s
        self.sum_xx = keep * self.sum_xx + rate * predicted_s * predicted_s
        self.sum_xy = keep * self.sum_xy + rate * predicted_s * observed_s

    def fit(self, prior_overhead_s: float = 0.0, separable: bool = True) -> tuple[float, float]:
        """(scale, overhead seconds); (1, prior) before any observation.

        Until the overhead can be separated (or when the fit is implausible, or the caller
        says the spread is not one it may separate on: ``separable``) the overhead is
        ``prior_overhead_s`` and the scale the ratio of means of the time above it.
        """
        level = self.level(prior_overhead_s)
        if level is None:
            return 1.0, prior_overhead_s
        ratio, prior = level
        mean_x, mean_y = self.sum_x / self.weight, self.sum_y / self.weight
        var_x = self.sum_xx / self.weight - mean_x * mean_x
        spread = var_x > (_MIN_SPREAD * mean_x) ** 2
        if not separable or self.count < _MIN_OBSERVATIONS or not spread:
            return ratio, prior
        scale = (self.sum_xy / self.weight - mean_x * mean_y) / var_x
        overhead = mean_y - scale * mean_x
        if scale <= 0 or overhead < 0 or overhead >= mean_y:
            return ratio, prior
        return scale, overhead

    def level(self, prior_overhead_s: float = 0.0) -> tuple[float, float] | None:
        """(ratio of means of the time above the overhead, that overhead): the fit without a
        slope of its own; None before any observation."""
        if self.weight <= 0:
            return None
        mean_x, mean_y = self.sum_x / self.weight, self.sum_y / self.weight
        prior = prior_overhead_s if prior_overhead_s < mean_y else 0.0
        return (mean_y - prior) / mean_x, prior


@dataclass
class WidthFit:
    """Exponentially weighted ratio of observed to table time, one padded width at one row.

    ``weight`` is 1 - (1 - rate)^n after n steps: how far this width's own ratio has replaced
    the row's fit in predictions (0: not seen, the row's scale and overhead price it).
    """

    weight: float = 0.0
    sum_x: float = 0.0
    sum_y: float = 0.0
    # For people (not used in pricing): steps folded in, and the one whose observed time was
    # furthest above its prediction, as (batch size, predicted s, observed s): a fit pulled
    # far from the table by one stall shows it (the real pair's plain width at the row of 64,
    # session 41: 4.73x the table, from steps the files did not show), and the steps folded in
    # at ``_STALL_MULTIPLE`` of their price (``worst`` keeps a clipped step's own time).
    steps: int = 0
    worst: tuple[int, float, float] | None = None
    clipped: int = 0
    # The row's age (``CostModel``'s clock) this fit was last brought to (``settle``), and
    # at its own last step.
    aged_at: float = 0.0
    own_at: float = 0.0

    def settle(self, clock: float) -> None:
        """Fade the fit by the row's steps at other widths since it was last settled, past
        the grace after its own last step."""
        start = max(self.aged_at, self.own_at + _GRACE)
        if clock > start and self.weight > 0:
            keep = math.exp(start - clock)
            self.weight *= keep
            self.sum_x *= keep
            self.sum_y *= keep
        self.aged_at = max(self.aged_at, clock)

    def ran(self, clock: float) -> None:
        """Its own step, at the row's age ``clock`` (after ``settle``)."""
        self.aged_at = self.own_at = clock

    def add(
        self,
        predicted_s: float,
        observed_s: float,
        rate: float,
        batch_size: int = 0,
        measured_s: float | None = None,
    ) -> None:
        """Fold in a step ``observed_s`` (``measured_s``: what it took, when ``observed_s``
        is that clipped to a multiple of its price)."""
        keep = 1.0 - rate
        self.weight = keep * self.weight + rate
        self.sum_x = keep * self.sum_x + rate * predicted_s
        self.sum_y = keep * self.sum_y + rate * observed_s
        self.steps += 1
        took = observed_s if measured_s is None else measured_s
        self.clipped += took > observed_s
        worst = self.worst
        if predicted_s > 0 and (worst is None or took / predicted_s > worst[2] / worst[1]):
            self.worst = (batch_size, predicted_s, took)

    @property
    def ratio(self) -> float:
        return self.sum_y / self.sum_x if self.sum_x > 0 else 1.0


@dataclass
class CostModel:
    """Table + online correction. ``snapshot()`` gives the immutable view policies use."""

    table: CostTable
    block_size: int = 16
    verify_width_multiple: int = 8
    draft_cost_fraction: float = 0.14
    learning_rate: float = 0.05
    prior_overhead_s: float = 0.0  # host time per step the table leaves out ...
    prior_overhead_per_request_s: float = 0.0  # ... plus this per request in the batch
    _correction: list[float] = field(default_factory=list)
    _overhead_s: list[float] = field(default_factory=list)
    _fits: list[RowFit] = field(default_factory=list)
    _width_fits: list[list[WidthFit]] = field(default_factory=list)  # [row][width index]
    _row_base_s: list[list[float]] = field(default_factory=list)  # table time, same indices
    _row_clock: list[float] = field(default_factory=list)  # each row's age (``WidthFit.settle``)
    _row_terms: list[Terms] = field(default_factory=list)  # ``_terms(row)``, kept current
    _layouts: dict[tuple[int, int], Layout] = field(default_factory=dict)
    _snapshot: CostSnapshot | None = None

    def __post_init__(self) -> None:
        rows = len(self.table.batch_sizes)
        self.widths = tuple(
            sorted({padded_width(k, self.verify_width_multiple) for k in range(self.block_size)})
        )
        self._correction = [1.0] * rows
        self._overhead_s = [self.prior_overhead(b) for b in self.table.batch_sizes]
        self._fits = [RowFit() for _ in range(rows)]
        self._width_fits = [[WidthFit() for _ in self.widths] for _ in range(rows)]
        self._row_clock = [0.0] * rows
        # A drafting step on a table of whole engine steps is at least the narrowest width it
        # measured with the draft: a two-phase step whose allocation verified nothing ran
        # the whole draft and a plain verify, and recorded at width 1 it was the plain width's
        # (the real pair, H100 call s42b: 14 such 64-row steps at 4.3-4.5 ms in the warm
        # pass priced a plain step at 3.4x the table, 1.3 ms, and no plain step ran again).
        counts = self.table.tokens_per_request
        self._drafting_width = float(min((t for t in counts if t > 1), default=2))
        # Per bucketed batch of the table: ascending token counts, and measured over the
        # table's time there (``token_bucket``).
        table = self.table
        self._buckets: list[tuple[int, list[int], list[float]]] = [
            (
                batch,
                [n for n, _ in points],
                [t / table.time_s(batch, n / batch) for n, t in points],
            )
            for batch, points in table.token_buckets
        ]
        self._row_base_s = [
            [self.step_base_s(b, w, 1.0 if w > 1 else 0.0) for w in self.widths]
            for b in self.table.batch_sizes
        ]
        self._row_terms = [self._terms(row) for row in range(rows)]

    def prior_overhead(self, batch_size: float) -> float:
        """The configured host time of a step at ``batch_size`` (before any fit)."""
        return self.prior_overhead_s + batch_size * self.prior_overhead_per_request_s

    def width_index(self, width: float) -> int:
        """Index in ``widths`` of the captured width a step of (mean) ``width`` runs at."""
        return min(bisect.bisect_left(self.widths, width - 1e-9), len(self.widths) - 1)

    def layout(self, batch_size: int, spec_tokens: int) -> Layout:
        """(table seconds, lower row, weight of the upper row, width index) of a step where
        every row verifies ``spec_tokens``; memoised, as the table never changes."""
        key = (batch_size, spec_tokens)
        found = self._layouts.get(key)
        if found is None:
            width = padded_width(spec_tokens, self.verify_width_multiple)
            base = self.step_base_s(batch_size, width, 1.0 if spec_tokens else 0.0)
            i, w = _bracket(self.table.batch_sizes, batch_size)
            found = self._layouts[key] = (base, i, min(max(w, 0.0), 1.0), self.width_index(width))
        return found

    def token_bucket(self, batch_size: int, tokens: float) -> tuple[float, float]:
        """The captured token count a drafting step of ``batch_size`` rows and ``tokens``
        tokens runs (the smallest measured one >= it at the first bucketed batch >= the
        step's), and the measured over the table's time there; ``(tokens, 1.0)`` unmeasured
        (no bucketed batch that large, or more tokens than its largest count)."""
        for bucket_batch, counts, ratios in self._buckets:
            if bucket_batch >= batch_size:
                at = bisect.bisect_left(counts, tokens)
                if at == len(counts):
                    break
                return float(counts[at]), ratios[at]
        return float(tokens), 1.0

    def step_base_s(self, batch_size: float, mean_width: float, drafting: float) -> float:
        """The table's time of a step as the engine runs it, before any online correction.

        On an engine whose rows verify at their own widths (``verify_width_multiple`` 1) a
        drafting step runs the captured token count at or above its tokens, so where the table
        measured them (``token_buckets``) it is priced there: the table's step at that count
        times the measured over the table's time. A GPU's verify climbs in stairs between the
        table's widths (tiles): with the session 37 8B profiles, at 32 rows k = 8 interpolated
        as 0.3% better than k = 7 where the counts it runs make it 8% worse. Elsewhere (padded
        engines, plain steps, batches whose graph is not a bucketed one), ``base_step_time_s``."""
        batch = max(1, round(batch_size))
        # only where the step's graph runs a bucketed batch (captured batch sizes double: a
        # step of 17-32 rows runs the 32-row graphs); smaller steps were not measured so
        bucketed = any(batch <= b < 2 * batch for b, _, _ in self._buckets)
        if drafting <= 0 or self.verify_width_multiple != 1 or not bucketed:
            return self.base_step_time_s(batch_size, mean_width, drafting)
        tokens, ratio = self.token_bucket(batch, batch * mean_width)
        return self.base_step_time_s(batch_size, tokens / batch, drafting) * ratio

    def base_step_time_s(self, batch_size: float, mean_width: float, drafting: float) -> float:
        """Uncorrected table time for a step; ``drafting`` = share of requests that draft."""
        target = self.table.time_s(batch_size, mean_width)
        if drafting <= 0 or self.table.includes_draft:
            return target
        draft = self.table.time_s(max(1.0, batch_size * drafting), float(self.block_size))
        return target + self.draft_cost_fraction * draft

    def observe_step(
        self, batch_size: int, mean_width: float, drafting: float, observed_s: float
    ) -> None:
        """Fold one measured step time into the fits of the nearest table rows: the row's
        scale and overhead, and that row's ratio for the step's padded width (a drafting
        step on a whole-step table: at least the narrowest width measured with the draft).
        Once a row's fit has ``_CLIP_AFTER`` observations, a step over ``_STALL_MULTIPLE`` x
        its current price there is folded in at that (a stall must not price a width out of
        use)."""
        self.observe_steps(((batch_size, mean_width, drafting, observed_s),))

    def observe_steps(self, steps: Sequence[tuple[int, float, float, float]]) -> None:
        """``observe_step`` for each (batch size, mean width, drafting, seconds) in order; the
        fits are solved once at the end (the same state as one call per step)."""
        touched: set[int] = set()
        shapes: dict[tuple[int, float, float], tuple[float, int, int, float]] = {}
        for batch_size, mean_width, drafting, observed_s in steps:
            if observed_s <= 0 or batch_size <= 0:
                continue
            shape = shapes.get((batch_size, mean_width, drafting))
            if shape is None:
                i, w = _bracket(self.table.batch_sizes, batch_size)
                width_for = mean_width
                if drafting > 0 and self.table.includes_draft:
                    width_for = max(mean_width, self._drafting_width)
                shape = shapes[(batch_size, mean_width, drafting)] = (
                    self.step_base_s(batch_size, width_for, drafting),
                    self.width_index(width_for),
                    i,
                    min(max(w, 0.0), 1.0),
                )
            predicted, width, i, w = shape
            for row, share in ((i, 1.0 - w), (i + 1, w)):
                if share <= 0:
                    continue
                rate = self.learning_rate * share
                fit, width_fit = self._fits[row], self._width_fits[row][width]
                width_fit.settle(self._row_clock[row])
                self._row_clock[row] += _AGE_PER_STEP * share
                width_fit.ran(self._row_clock[row])  # (its own step does not age it)
                observed = observed_s
                if fit.count >= _CLIP_AFTER:
                    price = self._price_now(row, fit, width_fit, predicted)
                    observed = min(observed_s, _STALL_MULTIPLE * price)
                fit.add(predicted, observed, rate, share)
                width_fit.add(predicted, observed, rate, batch_size, observed_s)
                touched.add(row)
        for row in touched:
            for width_fit in self._width_fits[row]:
                width_fit.settle(self._row_clock[row])
            prior = self.prior_overhead(self.table.batch_sizes[row])
            separable = self.separable(row)
            self._correction[row], self._overhead_s[row] = self._fits[row].fit(prior, separable)
            self._row_terms[row] = self._terms(row)
        # Keep the memoised snapshot until a touched row moved by more than 0.1%.
        if touched and self._snapshot is not None and self._moved(self._snapshot, sorted(touched)):
            self._snapshot = None

    def _price_now(self, row: int, fit: RowFit, width_fit: WidthFit, predicted_s: float) -> float:
        """What the fits as they stand price a step of table time ``predicted_s`` at this
        width of ``row``: the width's own ratio blended with the row's ratio of means (not
        the separated fit, solved once per batch of steps: this is current step by step, so
        steps folded together clip as one at a time do)."""
        level = fit.level(self.prior_overhead(self.table.batch_sizes[row]))
        assert level is not None, "a row with observations"
        ratio, overhead = level
        w = width_fit.weight
        return predicted_s * ((1.0 - w) * ratio + w * width_fit.ratio) + (1.0 - w) * overhead

    def widths_seen(self, row: int) -> int:
        """Captured widths whose own steps make up at least ``_SEEN_WIDTH_WEIGHT`` of their
        fit at ``row``. The row's overhead is separated only across two of them: a spread of
        predictions at one width comes from batch sizes between two rows, where the table's
        interpolation, not the step's width, is what the fit would explain (the real pair on
        an H100, call s37c: 64-row steps at k = 7 only, with batches of 33 to 63 between the
        rows, fitted an overhead of 0.8-1.2 ms and priced the plain step the row had never
        run at 1.9-2.2 ms, table 1.28, measured 1.59: drafting looked 1.3-1.5x better than
        it was, and a plain step was never tried to correct it)."""
        return sum(f.weight >= _SEEN_WIDTH_WEIGHT for f in self._width_fits[row])

    def separable(self, row: int) -> bool:
        """Whether ``row`` may separate an overhead: two widths it has seen (``widths_seen``)
        whose table times differ by more than ``_MIN_SPREAD`` of their mean. With every k a
        width of its own (a ragged engine's multiple of 1), k = 14 and k = 15 are two widths
        of about one cost: a batch-1 math phase ran them and a few steps of other widths,
        and the overhead fitted across them priced its plain step 5-9% over the measured one
        (the session 37 eager 8B call's steps, replayed)."""
        seen = [
            base
            for f, base in zip(self._width_fits[row], self._row_base_s[row], strict=True)
            if f.weight >= _SEEN_WIDTH_WEIGHT
        ]
        if len(seen) < 2:
            return False
        low, high = min(seen), max(seen)
        return high - low > _MIN_SPREAD * (high + low) / 2

    def _terms(self, row: int) -> Terms:
        """(factor, added seconds) per width at ``row``: T = table time x factor + added.

        A width's own ratio replaces the row's scale and overhead as its weight grows. Until it
        has, the row's scale and overhead price it, but never below the row's ratio of means: a
        fit that separates an overhead extrapolates to widths the row has barely run, and the
        real step times can be shaped unlike the table between its rows (on the H200 an
        8B-shape step of 33 to 64 rows costs the same; fitted across those batch sizes the row
        of 64 priced width 16 at 1.03x width 8, measured 1.49x, and a math batch of 64 ran
        width 16 for ~40 steps until that width's own ratio had learned it).
        """
        scale, overhead = self._correction[row], self._overhead_s[row]
        prior = self.prior_overhead(self.table.batch_sizes[row])
        level = self._fits[row].level(prior)
        # A table of the engine's own whole steps (its start-up profile) prices a plain step
        # at no less than it measured on the engine's own plain path (the plain fast path,
        # bursts) until the plain width's own steps take over: the row's fit comes from its
        # drafting steps, which may say little of that path (the real pair on an H100, call
        # s42b: drafting steps at the row of 8 ran 0.86-0.95x the table, plain ones 1.03x; the
        # row's 0.88 priced a plain step at 0.91 ms, no-spec's took 1.09, and the 8-client chat
        # phase ran plain steps where static k = 7 was 1.16x faster). Above the table the row's
        # fit stands (the 8B arm's call s37d: plain 64-row steps took 9.8 ms, 1.08x the table,
        # as its drafting steps' ratio said).
        own_plain = self.table.includes_draft and self.widths[0] == 1
        factors, added = [], []
        for w, (f, base) in enumerate(
            zip(self._width_fits[row], self._row_base_s[row], strict=True)
        ):
            s, a = scale, overhead
            if level is not None and base * level[0] + level[1] > base * scale + overhead:
                s, a = level
            if own_plain and w == 0 and base + prior > base * s + a:
                s, a = 1.0, prior
            factors.append((1.0 - f.weight) * s + f.weight * f.ratio)
            added.append((1.0 - f.weight) * a)
        return tuple(factors), tuple(added)

    def _moved(self, snapshot: CostSnapshot, rows: Sequence[int]) -> bool:
        for row in rows:
            factors, added = self._row_terms[row]
            for w, base in enumerate(self._row_base_s[row]):
                old = base * snapshot.factors[row][w] + snapshot.added_s[row][w]
                if abs(base * factors[w] + added[w] - old) > 1e-3 * old:
                    return True
            scale_moved = abs(self._correction[row] - snapshot.corrections[row])
            if scale_moved > 1e-3 * snapshot.corrections[row]:
                return True
        return False

    def width_fits(self) -> list[list[tuple[float, float]]]:
        """(ratio, weight) of every width fit, per batch size row (``OnlineModels.to_dict``)."""
        return [[(f.ratio, f.weight) for f in row] for row in self._width_fits]

    def width_steps(self, row: int) -> list[tuple[int, int, tuple[int, float, float] | None]]:
        """Per captured width at ``row``: the steps its fit has folded in, how many of them
        at ``_STALL_MULTIPLE`` of their price, and its most out-of-line one (batch size,
        predicted s, observed s), for people; not saved."""
        return [(f.steps, f.clipped, f.worst) for f in self._width_fits[row]]

    def load_corrections(
        self,
        corrections: Sequence[float],
        overheads_s: Sequence[float] = (),
        width_fits: Sequence[Sequence[Sequence[float]]] = (),
    ) -> None:
        """Restore the fits saved by ``OnlineModels.to_dict`` (one per batch size row; width
        fits as ``[ratio, weight]`` per captured width per row, none learned when absent)."""
        rows = len(self._correction)
        if len(corrections) != rows or any(c <= 0 for c in corrections):
            raise ValueError(
                f"cost_correction needs {rows} positive factors (one per "
                f"batch size of the table), got {list(corrections)}"
            )
        overheads = list(overheads_s) or [self.prior_overhead(b) for b in self.table.batch_sizes]
        if len(overheads) != rows or any(o < 0 for o in overheads):
            raise ValueError(
                f"cost_overhead_s needs {rows} non-negative seconds (one per batch size of "
                f"the table), got {list(overheads_s)}"
            )
        fits = [[WidthFit() for _ in self.widths] for _ in range(rows)]
        if width_fits:
            fits = self._restore_width_fits(width_fits)
        self._correction = list(corrections)
        self._overhead_s = overheads
        self._width_fits = fits
        self._row_clock = [0.0] * rows
        self._row_terms = [self._terms(row) for row in range(rows)]
        self._snapshot = None

    def _restore_width_fits(
        self, saved: Sequence[Sequence[Sequence[float]]]
    ) -> list[list[WidthFit]]:
        shape = f"{len(self.table.batch_sizes)} rows of {len(self.widths)} [ratio, weight] pairs"
        if len(saved) != len(self.table.batch_sizes):
            raise ValueError(f"cost_width_fits needs {shape}, got {len(saved)} rows")
        out = []
        for row in saved:
            pairs = [tuple(pair) for pair in row]
            bad = [p for p in pairs if len(p) != 2 or p[0] <= 0 or not 0 <= p[1] <= 1]
            if len(pairs) != len(self.widths) or bad:
                raise ValueError(f"cost_width_fits needs {shape}, got {list(row)}")
            out.append([WidthFit(weight, 1.0, ratio) for ratio, weight in pairs])
        return out

    def snapshot(self) -> CostSnapshot:
        if self._snapshot is None:
            terms = self._row_terms
            self._snapshot = CostSnapshot(
                self,
                tuple(self._correction),
                tuple(self._overhead_s),
                tuple(factors for factors, _ in terms),
                tuple(added for _, added in terms),
            )
        return self._snapshot


class CostSnapshot:
    """Immutable T(B, k) for one decision; memoised because policies ask many times."""

    def __init__(
        self,
        model: CostModel,
        correction: tuple[float, ...],
        overhead_s: tuple[float, ...],
        factors: tuple[tuple[float, ...], ...],
        added_s: tuple[tuple[float, ...], ...],
    ):
        self._model = model
        self._correction = correction
        self._overhead_s = overhead_s
        self.factors = factors  # [row][width index]: on the table time ...
        self.added_s = added_s  # ... plus these seconds
        self._memo: dict[tuple[int, int], float] = {}
        self.verify_width_multiple = model.verify_width_multiple

    @property
    def corrections(self) -> tuple[float, ...]:
        """Fitted factor on the table's time per batch size row (all widths together)."""
        return self._correction

    @property
    def overheads_s(self) -> tuple[float, ...]:
        """Fitted per-step overhead (seconds) per batch size row, added after the factor."""
        return self._overhead_s

    def correction(self, batch_size: float) -> float:
        return self._interpolate(self._correction, batch_size)

    def overhead_s(self, batch_size: float) -> float:
        return self._interpolate(self._overhead_s, batch_size)

    def _interpolate(self, rows: Sequence[float], batch_size: float) -> float:
        i, w = _bracket(self._model.table.batch_sizes, batch_size)
        w = min(max(w, 0.0), 1.0)
        return rows[i] + w * (rows[i + 1] - rows[i])

    def step_time_s(self, batch_size: int, spec_tokens: int) -> float:
        """Seconds for one step of ``batch_size`` requests all verifying ``spec_tokens``."""
        key = (batch_size, spec_tokens)
        cached = self._memo.get(key)
        if cached is None:
            base, i, w, c = self._model.layout(batch_size, spec_tokens)
            factors, added = self.factors, self.added_s
            factor = factors[i][c] + w * (factors[i + 1][c] - factors[i][c])
            extra = added[i][c] + w * (added[i + 1][c] - added[i][c])
            cached = self._memo[key] = base * factor + extra
        return cached


class RelativeCost:
    """Fallback T(B, k) in units of a plain batch-1 step, when no table was loaded.

    A fit to the Qwen3-8B H200 ratios in the GPU notes: each extra verified token per request
    costs ~0.45% of a plain step per request in the batch, on top of ~15% fixed overhead for
    a speculative step (memory-bound floor plus the draft forward). Only ratios matter to a
    policy choosing among k at one batch size, so the unit does not.
    """

    def __init__(self, verify_width_multiple: int = 8):
        self.verify_width_multiple = verify_width_multiple

    def step_time_s(self, batch_size: int, spec_tokens: int) -> float:
        width = padded_width(spec_tokens, self.verify_width_multiple)
        base = 1.0 + 0.0063 * (batch_size - 1)  # KV reads grow the plain step with B
        if spec_tokens <= 0:
            return base
        return base * (1.15 + 0.0045 * batch_size * (width - 1))
