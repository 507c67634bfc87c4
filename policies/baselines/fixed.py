"""No speculation and static k: the same k at every step, whatever the batch."""

from __future__ import annotations

from collections.abc import Sequence

from policies.baselines.base import StepChoice
from policies.types import StepRow


class FixedStep:
    """k = ``spec_tokens`` at every step; named ``no-spec`` (k = 0) or ``static-k<N>``."""

    def __init__(self, spec_tokens: int):
        if spec_tokens < 0:
            raise ValueError(f"spec_tokens must be >= 0, got {spec_tokens}")
        self.spec_tokens = spec_tokens
        self.name = "no-spec" if spec_tokens == 0 else f"static-k{spec_tokens}"

    def decide_step(self, rows: Sequence[StepRow], batch_size: int) -> StepChoice:
        return StepChoice(self.spec_tokens, f"{self.name}: B={batch_size} k={self.spec_tokens}")
