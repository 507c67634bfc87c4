"""A running request's bookkeeping (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engines.embedded.events import FinishReason, SamplingParams, SpecController


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    controller: SpecController
    context: dict[str, Any]
    output_ids: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    spec_tokens: list[int] = field(default_factory=list)  # k each step ran, aligned with the above
    slot: int = -1
    finish_reason: FinishReason | None = None
    num_controller_failures: int = 0  # steps whose controller raised (each drafted k = 0)
    # Positions just below ``position`` whose draft context is held in the runner's stash,
    # not yet in the draft's cache (``ModelRunner.defer_context``: k = 0 steps); inserted
    # before this request next drafts.
    pending_context: int = 0

    @property
    def position(self) -> int:
        """Position of the last token, the first input of the next verify (not yet cached)."""
        return len(self.prompt_ids) + len(self.output_ids) - 1

    @property
    def last_token(self) -> int:
        return self.output_ids[-1]

    @property
    def num_remaining(self) -> int:
        return self.params.max_new_tokens - len(self.output_ids)

    def append(self, tokens: list[int]) -> list[int]:
        """Append up to the length limit and the first stop token; return what was appended."""
        room = self.num_remaining
        kept = tokens[: max(room, 0)]
        stops = self.params.stop_token_ids
        if stops:
            for index, token in enumerate(kept):
                if token in stops:
                    kept = kept[: index + 1]
                    self.output_ids.extend(kept)
                    self.finish_reason = "stop"
                    return kept
        self.output_ids.extend(kept)
        if room <= len(kept):
            self.finish_reason = "length"
        return kept
