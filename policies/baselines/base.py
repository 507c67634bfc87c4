"""The seam every step-k policy shares: the rows of one engine step in, one k out.

A padded engine verifies every row of a step at one width, so the decision is the step's:
``StepPolicy.decide_step(rows, batch_size) -> StepChoice``. Rows describe what the engine knows
about each running request before the step; a harness builds them once per step and hands the
same list to whichever policy it is measuring (draftctl goodput through an adapter, or any
baseline here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.types import StepRow


@dataclass(frozen=True)
class StepChoice:
    """The step's k (0 = no drafting) and a reason a person can read."""

    spec_tokens: int
    reason: str


class StepPolicy(Protocol):
    """One k per engine step for a padded batch.

    ``rows``: every row of the coming step; ``batch_size``: the batch the cost model prices
    (normally ``len(rows)``). Implementations may keep state between calls (what they learned
    from the rows' histories); they never read a clock or do I/O.
    """

    name: str

    def decide_step(self, rows: Sequence[StepRow], batch_size: int) -> StepChoice: ...


def row_capacity(row: StepRow, max_spec_tokens: int) -> int:
    """Drafts ``row`` can verify this step under a policy allowing ``max_spec_tokens``."""
    return max(0, min(max_spec_tokens, row.max_spec_tokens))
