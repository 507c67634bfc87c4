"""vLLM's batch-size schedule as a step policy: k from the batch size alone.

vLLM's ``num_speculative_tokens_per_batch_size`` is a list of inclusive ranges
``[[batch_start, batch_end, k], ...]`` from batch 1; each step runs the k of the range holding
the step's batch size (``build_dynamic_sd_schedule_lookup`` in
``vllm/v1/spec_decode/dynamic/utils.py``: a batch size in a gap or past the last range takes
the k of the range before it; every k is capped at ``num_speculative_tokens``). The ranges are
the ones ``draftctl policy export-schedule`` prints:
``policies.schedule.build_schedule`` from the cost table and the global (per-task, mix-weighted)
acceptance. This module only looks them up; it computes nothing of its own.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence

from policies.baselines.base import StepChoice
from policies.schedule import ScheduleRange, build_schedule
from policies.types import StepCost, StepRow, Task


class BatchSizeSchedule:
    """k = the schedule's k for the step's batch size, capped at ``max_spec_tokens``."""

    name = "dsd-schedule"

    def __init__(self, ranges: Sequence[ScheduleRange], max_spec_tokens: int | None = None):
        _check(ranges)
        self.ranges = tuple(ranges)
        self.max_spec_tokens = max_spec_tokens
        self._starts = [r.batch_start for r in self.ranges]

    @classmethod
    def from_lists(
        cls, schedule: Sequence[Sequence[int]], max_spec_tokens: int | None = None
    ) -> BatchSizeSchedule:
        """From vLLM's JSON form (export-schedule's ``num_speculative_tokens_per_batch_size``)."""
        ranges = []
        for entry in schedule:
            if len(entry) != 3:
                raise ValueError(f"schedule entry {list(entry)}: expected [start, end, k]")
            ranges.append(ScheduleRange(int(entry[0]), int(entry[1]), int(entry[2])))
        return cls(ranges, max_spec_tokens)

    @classmethod
    def from_acceptance(
        cls,
        rates: Mapping[Task, Sequence[float]],
        mix: Mapping[Task, float],
        cost: StepCost,
        min_spec_tokens: int,
        max_spec_tokens: int,
        max_batch_size: int,
    ) -> BatchSizeSchedule:
        """The schedule export-schedule makes for a pool started with ``max_spec_tokens``."""
        ranges = build_schedule(rates, mix, cost, min_spec_tokens, max_spec_tokens, max_batch_size)
        return cls(ranges, max_spec_tokens)

    def spec_tokens_for(self, batch_size: int) -> int:
        if batch_size < 1:
            return 0
        k = self.ranges[bisect.bisect_right(self._starts, batch_size) - 1].spec_tokens
        return k if self.max_spec_tokens is None else min(k, self.max_spec_tokens)

    def decide_step(self, rows: Sequence[StepRow], batch_size: int) -> StepChoice:
        k = self.spec_tokens_for(batch_size)
        return StepChoice(k, f"{self.name}: B={batch_size} k={k}")


def _check(ranges: Sequence[ScheduleRange]) -> None:
    if not ranges:
        raise ValueError("a batch-size schedule needs at least one range")
    if ranges[0].batch_start != 1:
        raise ValueError(f"the schedule must start at batch 1, got {ranges[0].as_list()}")
    for r in ranges:
        if r.batch_end < r.batch_start or r.spec_tokens < 0:
            raise ValueError(f"schedule range {r.as_list()}: needs start <= end and k >= 0")
    for a, b in itertools.pairwise(ranges):
        if b.batch_start <= a.batch_end:
            raise ValueError(
                f"schedule ranges {a.as_list()} and {b.as_list()} overlap or are out of order"
            )
