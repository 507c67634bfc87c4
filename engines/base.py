"""The seam between the gateway and whatever runs a request.

A backend receives an already-validated OpenAI request body plus the policy's decision and
returns a response whose body is streamed back to the client as bytes. When the response
is finished, ``outcome`` carries what the backend reported about speculation for this
request (accept lengths), which the daemon feeds into its statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from policies.types import Task

Endpoint = Literal["chat", "completion"]


class BackendUnavailable(Exception):
    """The backend failed before sending the first byte; the gateway may retry elsewhere."""


class BackendFailed(Exception):
    """The backend failed after the response started (mid-stream)."""


@dataclass(frozen=True)
class BackendRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    stream: bool
    task: Task
    request_id: str


@dataclass
class Outcome:
    """What a backend reports once a request is done (None: not reported)."""

    num_output_tokens: int | None = None
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    # Accepted count per draft position (position 0 = first drafted token).
    accepted_per_position: list[int] = field(default_factory=list)
    # Per-step accept lengths, bonus included (embedded engine).
    accept_lengths: list[int] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)

    @property
    def mean_accept_length(self) -> float | None:
        """Mean tokens per verify step, bonus included (vLLM's mean acceptance length)."""
        if self.accept_lengths:
            return sum(self.accept_lengths) / len(self.accept_lengths)
        if self.num_drafts and self.num_accepted_tokens is not None:
            return 1.0 + self.num_accepted_tokens / self.num_drafts
        return None
