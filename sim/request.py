"""One request's state inside the simulated server."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.workload import RequestSpec


@dataclass
class SimRequest:
    spec: RequestSpec
    client: int
    arrival_s: float
    position: int = 0  # output tokens produced so far
    first_token_s: float | None = None
    finish_s: float | None = None
    k_history: list[int] = field(default_factory=list)
    accept_history: list[int] = field(default_factory=list)
    _hint: int = 0

    @property
    def num_steps(self) -> int:
        return len(self.k_history)

    @property
    def remaining(self) -> int:
        return self.spec.num_output_tokens - self.position

    def peek_accepted(self, spec_tokens: int) -> int:
        """Drafts a step verifying ``spec_tokens`` would accept now (the oracle's lookahead)."""
        accepted, _ = self.spec.trace.accepted_at(self.position, spec_tokens, self._hint)
        return accepted

    def advance(self, spec_tokens: int) -> int:
        """Run one decode step with k = ``spec_tokens``; returns tokens emitted (>= 1)."""
        accepted, self._hint = self.spec.trace.accepted_at(self.position, spec_tokens, self._hint)
        emitted = min(accepted + 1, self.remaining)
        self.position += emitted
        self.k_history.append(spec_tokens)
        self.accept_history.append(accepted + 1)
        return emitted
