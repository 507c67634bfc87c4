"""The static policy: a lookup table of (task, concurrency band) -> k."""

from __future__ import annotations

from bisect import bisect_left

from policies.model import StaticSpec
from policies.types import Decision, Observation, clamp_spec_tokens


def _band_label(bands: list[int], index: int) -> str:
    lo = 1 if index == 0 else bands[index - 1] + 1
    if index == len(bands):
        return f">{bands[-1]}" if bands else "all"
    return f"{lo}-{bands[index]}"


class StaticPolicy:
    """Pure table lookup; ``max`` resolves to the observation's max_spec_tokens."""

    name = "static"

    def __init__(self, spec: StaticSpec):
        self._spec = spec

    def decide(self, observation: Observation) -> Decision:
        bands = self._spec.concurrency_bands
        index = bisect_left(bands, max(1, observation.concurrency))
        raw = self._spec.spec_tokens[observation.task][index]
        wanted = observation.max_spec_tokens if raw == "max" else raw
        k = clamp_spec_tokens(wanted, observation.min_spec_tokens, observation.max_spec_tokens)
        reason = (
            f"static: task={observation.task.value} concurrency={observation.concurrency} "
            f"band {_band_label(bands, index)} -> k={k}"
        )
        return Decision(spec_tokens=k, reason=reason)
