"""The seam every step-k policy shares: the rows of one engine step in, one k out.

A padded engine verifies every row of a step at one width, so the decision is the step's:
``StepPolicy.decide_step(rows, batch_size) -> StepChoice``. Rows describe what the engine knows
about each running request before the step; a harness builds them once per step and hands the
same list to whichever policy it is measuring (draftctl goodput through an adapter, or any
baseline here).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
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


def scored_outcomes(
    rows: Sequence[StepRow],
    index: Mapping[Hashable, int],
    seen: Sequence[int],
    max_spec_tokens: int,
) -> list[tuple[int, int, int]]:
    """The outcome of the step each row was last scored for: ``(where it was scored, the k it
    ran, the drafts it accepted)``; ``index``: row id -> scored row, ``seen``: per scored row,
    ``len(accept_lengths)`` when scored (that step's outcome index). Rows not scored then, or
    whose outcome has not arrived, are left out."""
    out = []
    for row in rows:
        j = index.get(row.row_id)
        if j is None:
            continue
        i = seen[j]
        if i >= len(row.accept_lengths) or i >= len(row.spec_tokens):
            continue
        ran = min(row.spec_tokens[i], max_spec_tokens)
        out.append((j, ran, max(0, min(row.accept_lengths[i] - 1, ran))))
    return out


def row_capacity(row: StepRow, max_spec_tokens: int) -> int:
    """Drafts ``row`` can verify this step under a policy allowing ``max_spec_tokens``."""
    return max(0, min(max_spec_tokens, row.max_spec_tokens))
