"""Step cost T(batch, k): a profiled table, interpolated, padded and refined online.

The table (``cost_tables/*.json``) holds the engine's measured time of one target forward
with ``tokens_per_request`` new tokens for each of ``batch_sizes`` requests. A verify step
with k drafted tokens has width k + 1; engines that replay captured shapes pad that width up
to a multiple (``verify_width_multiple``, 8 on the H200 notes: T = 5 and 9 cost more than 8
and 16). A step that drafts also pays the draft forward, modelled as ``draft_cost_fraction``
of a target forward at the full block width when the table has no draft row.

Online refinement, per batch size row of the table: observed step times are regressed on the
table's prediction, ``observed ~ scale x predicted + overhead`` (exponentially weighted). Once a
row has seen steps of clearly different predicted cost (e.g. plain and drafting steps) the fit
separates a per-step host overhead, which scales nothing, from a factor on the forward;
until then, or when the fit is implausible, the overhead is 0 and the scale is the ratio of
means. An overhead matters for the choice of k: it makes wide verifies relatively cheaper.
A configured host overhead (``prior_overhead_s`` + batch size x ``prior_overhead_per_request_s``:
scheduling, sampling, the policy's own time, which the table's graph-replay times leave out)
is added from the start and stands in until a row's fit separates one of its own; the
ratio-of-means scale is then taken on the time above it. Predictions interpolate scale and
overhead between rows. Plain data; the one
function that reads a file, ``load_cost_table``, is for the daemon and tools, never a policy.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
        )

    def time_s(self, batch_size: float, tokens: float) -> float:
        """Bilinear interpolation; linear extrapolation past the largest batch or width."""
        bi, bw = _bracket(self.batch_sizes, batch_size)
        ti, tw = _bracket(self.tokens_per_request, tokens)
        rows = self.step_time_s

        def at(b: int) -> float:
            return rows[b][ti] + tw * (rows[b][ti + 1] - rows[b][ti])

        value = at(bi) + bw * (at(bi + 1) - at(bi))
        return max(value, 1e-9)


def load_cost_table(path: str | Path) -> CostTable:
    """Read a cost table JSON file; errors name the file and what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cost table {path}: cannot read it ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"cost table {path}: expected a JSON object")
    try:
        return CostTable.from_dict(data, source=str(path))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cost table {path}: {exc}") from exc


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


# The overhead is fitted only once a row's predictions spread by this fraction of their mean
# and it has seen this many observations (fractional when a step falls between two rows).
_MIN_SPREAD = 0.05
_MIN_OBSERVATIONS = 20.0


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

    def fit(self, prior_overhead_s: float = 0.0) -> tuple[float, float]:
        """(scale, overhead seconds); (1, prior) before any observation.

        Until the overhead can be separated (or when the fit is implausible) the overhead is
        ``prior_overhead_s`` and the scale the ratio of means of the time above it.
        """
        if self.weight <= 0:
            return 1.0, prior_overhead_s
        mean_x, mean_y = self.sum_x / self.weight, self.sum_y / self.weight
        prior = prior_overhead_s if prior_overhead_s < mean_y else 0.0
        ratio = (mean_y - prior) / mean_x
        var_x = self.sum_xx / self.weight - mean_x * mean_x
        if self.count < _MIN_OBSERVATIONS or var_x <= (_MIN_SPREAD * mean_x) ** 2:
            return ratio, prior
        scale = (self.sum_xy / self.weight - mean_x * mean_y) / var_x
        overhead = mean_y - scale * mean_x
        if scale <= 0 or overhead < 0 or overhead >= mean_y:
            return ratio, prior
        return scale, overhead


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
    _snapshot: CostSnapshot | None = None

    def __post_init__(self) -> None:
        rows = len(self.table.batch_sizes)
        self._correction = [1.0] * rows
        self._overhead_s = [self.prior_overhead(b) for b in self.table.batch_sizes]
        self._fits = [RowFit() for _ in range(rows)]

    def prior_overhead(self, batch_size: float) -> float:
        """The configured host time of a step at ``batch_size`` (before any fit)."""
        return self.prior_overhead_s + batch_size * self.prior_overhead_per_request_s

    def base_step_time_s(self, batch_size: float, mean_width: float, drafting: float) -> float:
        """Uncorrected table time for a step; ``drafting`` = share of requests that draft."""
        target = self.table.time_s(batch_size, mean_width)
        if drafting <= 0:
            return target
        draft = self.table.time_s(max(1.0, batch_size * drafting), float(self.block_size))
        return target + self.draft_cost_fraction * draft

    def observe_step(
        self, batch_size: int, mean_width: float, drafting: float, observed_s: float
    ) -> None:
        """Fold one measured step time into the fits of the nearest table rows."""
        if observed_s <= 0 or batch_size <= 0:
            return
        predicted = self.base_step_time_s(batch_size, mean_width, drafting)
        i, w = _bracket(self.table.batch_sizes, batch_size)
        w = min(max(w, 0.0), 1.0)
        for row, share in ((i, 1.0 - w), (i + 1, w)):
            if share <= 0:
                continue
            self._fits[row].add(predicted, observed_s, self.learning_rate * share, share)
            prior = self.prior_overhead(self.table.batch_sizes[row])
            scale, overhead = self._fits[row].fit(prior)
            self._correction[row], self._overhead_s[row] = scale, overhead
        # Keep the memoised snapshot until a row moved by more than 0.1% of its plain step.
        if self._snapshot is not None and self._moved(self._snapshot):
            self._snapshot = None

    def _moved(self, snapshot: CostSnapshot) -> bool:
        for row, b in enumerate(self.table.batch_sizes):
            plain = self.table.time_s(b, 1.0)
            old = snapshot.corrections[row] * plain + snapshot.overheads_s[row]
            new = self._correction[row] * plain + self._overhead_s[row]
            scale_moved = abs(self._correction[row] - snapshot.corrections[row])
            if abs(new - old) > 1e-3 * old or scale_moved > 1e-3 * snapshot.corrections[row]:
                return True
        return False

    def load_corrections(
        self, corrections: Sequence[float], overheads_s: Sequence[float] = ()
    ) -> None:
        """Restore the fits saved by ``OnlineModels.to_dict`` (one per batch size row)."""
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
        self._correction = list(corrections)
        self._overhead_s = overheads
        self._snapshot = None

    def snapshot(self) -> CostSnapshot:
        if self._snapshot is None:
            self._snapshot = CostSnapshot(self, tuple(self._correction), tuple(self._overhead_s))
        return self._snapshot


class CostSnapshot:
    """Immutable T(B, k) for one decision; memoised because policies ask many times."""

    def __init__(
        self, model: CostModel, correction: tuple[float, ...], overhead_s: tuple[float, ...]
    ):
        self._model = model
        self._correction = correction
        self._overhead_s = overhead_s
        self._memo: dict[tuple[int, int], float] = {}
        self.verify_width_multiple = model.verify_width_multiple

    @property
    def corrections(self) -> tuple[float, ...]:
        """Fitted factor on the table's time per batch size row."""
        return self._correction

    @property
    def overheads_s(self) -> tuple[float, ...]:
        """Fitted per-step overhead (seconds) per batch size row, added after the factor."""
        return self._overhead_s

    def correction(self, batch_size: float) -> float:
        return self._interpolate(self._correction, batch_size)

    def overhead_s(self, batch_size: float) -> float:
        return self._interpolate(self._overhead_s, batch_size)

    def _interpolate(self, rows: tuple[float, ...], batch_size: float) -> float:
        i, w = _bracket(self._model.table.batch_sizes, batch_size)
        w = min(max(w, 0.0), 1.0)
        return rows[i] + w * (rows[i + 1] - rows[i])

    def step_time_s(self, batch_size: int, spec_tokens: int) -> float:
        """Seconds for one step of ``batch_size`` requests all verifying ``spec_tokens``."""
        key = (batch_size, spec_tokens)
        cached = self._memo.get(key)
        if cached is None:
            width = padded_width(spec_tokens, self.verify_width_multiple)
            base = self._model.base_step_time_s(batch_size, width, 1.0 if spec_tokens else 0.0)
            cached = base * self.correction(batch_size) + self.overhead_s(batch_size)
            self._memo[key] = cached
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
