"""Public value types of the embedded engine (no torch): what callers pass in and get back."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from policies.slot_scoring import SlotScoring
from policies.types import PositionValues

FinishReason = Literal["stop", "length"]
# How CUDA-graph verifies run (docs/engine.md, "Ragged verify on CUDA"): every row padded to the
# widest k, or packed to the tokens the rows use (graphs keyed on a token bucket).
VerifyMode = Literal["padded", "ragged"]
VERIFY_MODES: tuple[VerifyMode, ...] = ("padded", "ragged")
# What ``torch_compile`` compiles: each forward whole, or the target's decoder-layer step once
# for every layer (regional compilation; ``ModelRunner``).
CompileScope = Literal["forward", "layer"]
COMPILE_SCOPES: tuple[CompileScope, ...] = ("forward", "layer")
# How ``torch_compile`` compiles: inductor's default; max-autotune (benchmarks kernel choices,
# GEMM templates included, per shape at start-up, plus coordinate-descent tuning; our own CUDA
# graphs replay the result, so inductor's are off: "max-autotune-no-cudagraphs"); or
# coordinate-descent (only the tuning of inductor's generated kernels' launch configurations,
# no GEMM search: what max-autotune does besides the GEMMs). ``ModelRunner``.
CompileMode = Literal["default", "max-autotune", "coordinate-descent"]
COMPILE_MODES: tuple[CompileMode, ...] = ("default", "max-autotune", "coordinate-descent")


def inductor_arguments(mode: CompileMode) -> dict[str, Any]:
    """``torch.compile``'s keyword arguments (``mode`` or ``options``) for a ``CompileMode``."""
    if mode == "max-autotune":
        return {"mode": "max-autotune-no-cudagraphs"}
    if mode == "coordinate-descent":
        return {"options": {"coordinate_descent_tuning": True}}
    return {}


# The target's attention kernel (docs/engine.md, "Attention"): PyTorch SDPA with a dense mask,
# or a split-KV Triton kernel reading only the keys each row uses (decode_attention.py).
Attention = Literal["sdpa", "triton"]
ATTENTIONS: tuple[Attention, ...] = ("sdpa", "triton")
# What callers ask for: a kernel, or ``auto`` (the engine's default): triton on a CUDA device
# where the start-up check passes it, else sdpa (``ModelRunner``).
AttentionChoice = Literal["auto", "sdpa", "triton"]
ATTENTION_CHOICES: tuple[AttentionChoice, ...] = ("auto", "sdpa", "triton")
# The linear layers' kernel: PyTorch's (``F.linear``: cuBLAS, or what torch.compile picks) or
# ``gemv`` (engines/embedded/gemv.py: one Triton kernel for steps of up to 16 tokens), or
# ``fused``: gemv with the layers' RMSNorms, SiLU gate and residual adds inside it (steps of up
# to 16 tokens; larger ones as gemv).
LinearKernel = Literal["aten", "gemv", "fused"]
LINEAR_KERNELS: tuple[LinearKernel, ...] = ("aten", "gemv", "fused")
# What callers ask for: a kernel, or ``auto`` (the engine's default): fused on a CUDA device,
# aten elsewhere (``ModelRunner``).
LinearChoice = Literal["auto", "aten", "gemv", "fused"]
LINEAR_CHOICES: tuple[LinearChoice, ...] = ("auto", "aten", "gemv", "fused")
# Where a request failed inside the engine (see RequestFailed).
FailureStage = Literal["prepare", "prefill", "step", "postprocess", "engine loop"]

MAX_TOP_K = 2**63 - 1  # top_k travels to the device as int64
MIN_SEED, END_SEED = -(2**63), 2**64  # what torch.Generator.manual_seed accepts


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy (exactly target-only greedy output)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None  # per-request generator; None = the engine's shared one

    def __post_init__(self) -> None:
        """Types and ranges of every field, so nothing reaches the engine thread that can only
        fail there (a bad seed used to raise in ``manual_seed`` on that thread)."""
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}: must be an integer >= 1")
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature={self.temperature!r}: must be a finite number >= 0")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r}: must be a number in (0, 1]")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k={self.top_k!r}: must be an integer in [0, 2**63) (0 = off)")
        if not isinstance(self.stop_token_ids, tuple) or not all(
            _is_int(t) for t in self.stop_token_ids
        ):
            raise ValueError(f"stop_token_ids={self.stop_token_ids!r}: must be a tuple of integers")
        if self.seed is not None and not (_is_int(self.seed) and MIN_SEED <= self.seed < END_SEED):
            raise ValueError(f"seed={self.seed!r}: must be an integer in [-2**63, 2**64) or None")


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
    # The k each of ``accept_lengths``' steps actually ran (after the engine's clamp), aligned;
    # the request's own list like ``accept_lengths``.
    spec_tokens: list[int] = field(default_factory=list)
    # The largest k this row can run this step: block_size - 1, or less near the request's
    # end (a step never drafts past what the request may still emit).
    max_spec_tokens: int = 0
    # What the request may still emit (its max_new_tokens less its output so far; an end of
    # sequence may come sooner): the batch planner's drain rule reads it.
    num_remaining: int = 0


@dataclass(frozen=True)
class StepReport:
    """One verify step of one request. accept_length counts the bonus token (>= 1)."""

    spec_tokens: int
    accept_length: int
    accepted: list[bool]  # per drafted position: accepted before the first rejection
    step_time_s: float  # device time of the whole batched step
    batch_size: int
    # Per drafted position: the draft distribution's top-1 probability (the draft's own
    # confidence; in synthetic-acceptance mode a drawn one, docs/synthetic.md; empty when the
    # step did not measure it).
    draft_confidence: tuple[float, ...] = ()
    # The step was two-phase: every row drafted all it might, then each verified its own k.
    two_phase: bool = False
    # The engine call this step ran in set up something for a shape met for the first time
    # (a device allocation's CUDA graph: ``ModelRunner.lazy_set_ups``), so its time holds that
    # one-off cost (85 ms for the first on the 8B H100 arm, session 52), not the step's own.
    first_use: bool = False


@dataclass(frozen=True)
class TokenEvent:
    token_ids: list[int]
    report: StepReport | None  # None for the first token (from prefill)
    finished: bool
    finish_reason: FinishReason | None


# Called on the engine thread before every step; returns k in 0..block_size-1. Must be fast.
SpecController = Callable[[RequestView], int]


class StepPlanner(Protocol):
    """Chooses k for every row of a step in one call (engine thread, once per step): what an
    engine whose rows share a verify width needs. ``controllers`` are the rows' own
    ``SpecController``s, in the same order as ``views``; the engine clamps each answer."""

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]: ...

    def record(self, controllers: Sequence[SpecController], reports: Sequence[StepReport]) -> None:
        """What a planned step did, row by row: the k each row ran, its accept length and the
        step's time (engine thread, while the next step runs on the device)."""
        ...

    def prepare(self, views: Sequence[RequestView], controllers: Sequence[SpecController]) -> None:
        """Work toward the next step while this one runs on the device: ``views`` are this
        step's rows before its results (one step stale). ``plan`` may use it or not."""
        ...


@runtime_checkable
class SlotPlanner(StepPlanner, Protocol):
    """A planner that may allocate k per row after the draft has run (a two-phase step):
    ``plan`` then gives what each row drafts, ``allocate`` what each row verifies."""

    def allocates(self) -> bool:
        """Whether the step just planned is two-phase."""
        ...

    def allocate(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        confidence: Sequence[PositionValues],
    ) -> list[int]:
        """k per row from each row's draft confidence at its drafted positions (per row a
        sequence of floats or a float64 array; the engine hands array rows)."""
        ...


@runtime_checkable
class DeviceSlotPlanner(SlotPlanner, Protocol):
    """A slot planner whose allocation can run on the device (no host sync between draft and
    verify; ``policies.slot_scoring``): before the draft it gives the scoring of the draft's
    confidence and its estimate of the slots worth verifying, from what it knew then (the rows'
    confidence of their previous step: one step stale, as vLLM's budget is)."""

    def allocates_on_device(self) -> bool:
        """Whether the two-phase step just planned allocates on the device (else on the host:
        ``allocate``)."""
        ...

    def slot_scoring(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        drafted: Sequence[int],
    ) -> SlotScoring | None:
        """The scoring for the step just planned (``drafted``: what each row drafts), asked
        once the draft is queued, so it runs while the device drafts; None: every row
        verifies what it drafted."""
        ...

    def scored_on_device(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        confidence: Sequence[PositionValues],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
    ) -> None:
        """After such a step, before anything else of the planner: the draft confidence the
        device scored (per row, every drafted position), the k it gave each row and each
        row's accept length (bonus included)."""
        ...


@runtime_checkable
class TimesCalls(Protocol):
    """A planner that prices steps by the engine's wall time, not the runner's device time
    alone: after each decode call, before that call's steps are recorded, the engine tells
    it the call's wall time over its steps (its planning, the steps, the host work behind
    them and the rows' bookkeeping; not the admissions' prefill, which runs before it)."""

    def call_time(self, seconds_per_step: float) -> None: ...


@runtime_checkable
class TimesPrefills(Protocol):
    """A planner that times engine calls on its own clock, from one ``plan`` to the next, and
    leaves the admissions' prefill out of them: before a decode call plans, the engine tells
    it how long that call's prefill of newly admitted requests took (only when it admitted
    any). A prefill belongs to no step mode: it runs whenever a request arrives, and counted
    in the call before it, it charged that call's steps (on the real pair, 4-11 ms a burst
    against ~1.1 ms a plain 64-row step)."""

    def prefill_time(self, seconds: float) -> None: ...


@runtime_checkable
class PreparesAllocation(Protocol):
    """A slot planner that can do the confidence-free part of ``allocate`` while the device
    drafts (the engine calls it between the draft's launch and the confidence's copy)."""

    def prepare_allocation(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> None: ...


class RequestFailed(RuntimeError):
    """A request ended inside the engine by a failure of its own (or of the engine loop).

    Consumers of ``AsyncEngine.generate`` get it raised from the stream in place of the next
    ``TokenEvent``; ``Engine.step`` returns it in place of a ``TokenEvent``. No event with
    ``finished=True`` follows: the exception is the end of the stream. The original exception
    is ``__cause__``. Other requests of the same step are unaffected (see docs/engine.md,
    "Failure isolation"). Not a ``ValueError``: bad input is refused at submit time instead.
    """

    def __init__(self, request_id: str, stage: FailureStage, message: str) -> None:
        super().__init__(f"request {request_id} failed in {stage}: {message}")
        self.request_id = request_id
        self.stage = stage
