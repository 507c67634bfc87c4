"""Public value types of the embedded engine (no torch): what callers pass in and get back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy (exactly target-only greedy output)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None  # per-request generator; None = the engine's shared one

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k}: must be >= 0 (0 = off)")


@dataclass(frozen=True)
class RequestView:
    """What the spec controller sees for one request before each step."""

    request_id: str
    step_index: int
    # The request's own list, not a copy (a copy per row per step grows with the request):
    # read it during the call, never mutate or keep it.
    accept_lengths: list[int]
    batch_size: int
    num_generated: int
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepReport:
    """One verify step of one request. accept_length counts the bonus token (>= 1)."""

    spec_tokens: int
    accept_length: int
    accepted: list[bool]  # per drafted position: accepted before the first rejection
    step_time_s: float  # device time of the whole batched step
    batch_size: int


@dataclass(frozen=True)
class TokenEvent:
    token_ids: list[int]
    report: StepReport | None  # None for the first token (from prefill)
    finished: bool
    finish_reason: FinishReason | None


# Called on the engine thread before every step; returns k in 0..block_size-1. Must be fast.
SpecController = Callable[[RequestView], int]
