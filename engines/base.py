"""The seam between the gateway and whatever runs a request.

A backend receives an already-validated OpenAI request body plus the policy's decision and
returns a response whose body is streamed back to the client as bytes. When the response
is finished, ``outcome`` carries what the backend reported about speculation for this
request (accept lengths), which the daemon feeds into its statistics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from policies.types import Task

Endpoint = Literal["chat", "completion"]


class BackendUnavailable(Exception):
    """The backend failed before sending the first byte; the gateway may retry elsewhere."""


@dataclass(frozen=True)
class BackendRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    stream: bool
    task: Task
    request_id: str
    # The task guess's confidence (the embedded engine's per-step policy sees it).
    confidence: float = 1.0
    # The client's body bytes when ``body`` is exactly what they encode (pools forward them
    # with their own fields spliced in instead of encoding ``body`` again); None otherwise.
    raw: bytes | None = None


@dataclass
class Outcome:
    """What a backend reports once a request is done (None: not reported)."""

    num_output_tokens: int | None = None
    num_prompt_tokens: int | None = None
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    # Accepted count per draft position (position 0 = first drafted token).
    accepted_per_position: list[int] = field(default_factory=list)
    # Per-step accept lengths, bonus included (embedded engine).
    accept_lengths: list[int] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    # Times of this request's steps that drafted nothing (k = 0), embedded engine; with
    # ``step_times_s`` they give the measured step-time speedup.
    plain_step_times_s: list[float] = field(default_factory=list)
    # Seconds from the first output token to the last as the backend saw them (embedded
    # engine): the decode time behind TPOT, also for a request that was not streamed.
    decode_s: float | None = None
    # Why the k of the request's last step (embedded engine: the step planner's reason).
    reason: str | None = None
    # The k of each step in ``accept_lengths`` (embedded engine: k may change every step).
    step_spec_tokens: list[int] = field(default_factory=list)
    # The backend already fed these steps to the running policy's online models, step by step
    # (the embedded engine's step controller): the daemon must not learn them again.
    is_learned: bool = False

    def mean_spec_tokens(self) -> float | None:
        """The k the request's steps ran on average, plain (k = 0) steps included (embedded
        engine); None when the backend reports no steps."""
        num_steps = len(self.step_spec_tokens) + len(self.plain_step_times_s)
        return sum(self.step_spec_tokens) / num_steps if num_steps else None

    @property
    def mean_accept_length(self) -> float | None:
        """Mean tokens per verify step, bonus included (vLLM's mean acceptance length)."""
        if self.accept_lengths:
            return sum(self.accept_lengths) / len(self.accept_lengths)
        if self.num_drafts and self.num_accepted_tokens is not None:
            return 1.0 + self.num_accepted_tokens / self.num_drafts
        return None


# --- The backend protocol the gateway drives (added with the gateway, issue 2). ---

# Builds the top-level ``draftctl`` object for the final chunk/body from what the backend
# reported; the backend calls it once, when it writes that final chunk.
Annotator = Callable[[Outcome], dict[str, Any]]


@dataclass
class BackendResponse:
    """A started response: status, content type and the body bytes to send to the client.

    ``outcome`` is filled in while ``body`` is consumed; read it after the body ends.
    """

    status: int
    media_type: str
    body: AsyncIterator[bytes]
    outcome: Outcome = field(default_factory=Outcome)
    # Set by the body iterator when the backend failed mid-stream (the client got an error).
    error: str | None = None
    # Frees what the response holds if its body is closed without having run; idempotent.
    release: Callable[[], None] | None = None


class Backend(Protocol):
    """One pool (servers with one fixed k) or an engine that sets k per request.

    The k range, one representation: ``is_adjustable`` is True when k is chosen per request
    (the embedded engine), and ``max_spec_tokens`` is then the largest k it can run
    (block_size - 1); for a pool it is the k its servers were started with.
    ``submit`` raises BackendUnavailable before the first byte (the gateway retries on
    another pool); failures after that end the body with an error event instead.
    """

    name: str
    kind: str
    model: str
    block_size: int
    max_spec_tokens: int
    is_adjustable: bool

    def is_healthy(self) -> bool: ...

    def num_inflight(self) -> int: ...

    def num_servers(self) -> int:
        """Healthy servers behind this backend (at least 1): load spill compares in-flight
        requests per server."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def submit(
        self, request: BackendRequest, spec_tokens: int, annotate: Annotator
    ) -> BackendResponse: ...


def fixed_spec_tokens(backend: Backend) -> int | None:
    """The k every request on ``backend`` runs with; None when k is chosen per request."""
    return None if backend.is_adjustable else backend.max_spec_tokens
