"""The policy file's model: what operators edit as YAML (file or admin API).

One document chooses a policy ``kind`` and holds that kind's settings. Bounds are shared:
``min_spec_tokens`` (default 4) and ``max_spec_tokens`` (default: the draft's block size - 1,
resolved per backend at decision time). k = 0 always means drafting off.
"""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies.types import TASKS, Task
from policies.validation import validate_yaml

SpecTokens = int | Literal["max"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _default_table() -> dict[Task, list[SpecTokens]]:
    # Usual tuning advice: full block for math and code up to moderate concurrency, smaller k
    # for chat as load grows, drafting off for chat at high concurrency.
    return {
        Task.MATH: ["max", "max", 7, 4],
        Task.CODE: ["max", "max", 7, 4],
        Task.CHAT: [7, 4, 4, 0],
    }


class StaticSpec(StrictModel):
    """A table of (task, concurrency band) -> k.

    ``concurrency_bands`` are the inclusive upper edges of all bands but the last, ascending:
    ``[8, 32, 64]`` makes four bands: 1-8, 9-32, 33-64 and above 64. Each task lists one k per
    band; ``max`` means max_spec_tokens, 0 means drafting off.
    """

    concurrency_bands: list[int] = Field(default_factory=lambda: [8, 32, 64])
    spec_tokens: dict[Task, list[SpecTokens]] = Field(default_factory=lambda: _default_table())

    @field_validator("concurrency_bands")
    @classmethod
    def _ascending(cls, bands: list[int]) -> list[int]:
        if any(b < 1 for b in bands):
            raise ValueError("band edges must be >= 1")
        if any(b >= c for b, c in itertools.pairwise(bands)):
            raise ValueError("band edges must be strictly ascending")
        return bands

    @field_validator("spec_tokens")
    @classmethod
    def _non_negative(cls, table: dict[Task, list[SpecTokens]]) -> dict[Task, list[SpecTokens]]:
        for task, row in table.items():
            for k in row:
                if isinstance(k, int) and k < 0:
                    raise ValueError(f"{task.value}: k must be >= 0 (0 = drafting off), got {k}")
        return table

    @model_validator(mode="after")
    def _shape(self) -> StaticSpec:
        missing = [t.value for t in TASKS if t not in self.spec_tokens]
        if missing:
            raise ValueError(f"spec_tokens needs a row for every task; missing: {missing}")
        want = len(self.concurrency_bands) + 1
        for task, row in self.spec_tokens.items():
            if len(row) != want:
                raise ValueError(
                    f"spec_tokens.{task.value} has {len(row)} entries but "
                    f"{len(self.concurrency_bands)} band edges make {want} bands"
                )
        return self


class PolicySpec(StrictModel):
    """The whole policy document."""

    kind: Literal["static", "goodput"] = "static"
    min_spec_tokens: int = Field(default=4, ge=1)
    max_spec_tokens: int | None = Field(
        default=None, ge=1, description="default: block_size - 1 of the backend"
    )
    static: StaticSpec = Field(default_factory=StaticSpec)

    @model_validator(mode="after")
    def _bounds(self) -> PolicySpec:
        if self.max_spec_tokens is not None and self.max_spec_tokens < self.min_spec_tokens:
            raise ValueError(
                f"max_spec_tokens ({self.max_spec_tokens}) must be >= "
                f"min_spec_tokens ({self.min_spec_tokens})"
            )
        return self

    def bounds_for(self, block_size: int) -> tuple[int, int]:
        """The effective [min, max] k for a draft of ``block_size`` (k <= block_size - 1)."""
        ceiling = block_size - 1
        hi = ceiling if self.max_spec_tokens is None else min(self.max_spec_tokens, ceiling)
        lo = min(self.min_spec_tokens, hi)
        return lo, hi


def parse_policy(text: str) -> PolicySpec:
    """Validate policy YAML; raises policies.validation.InvalidDocument with every problem."""
    return validate_yaml(PolicySpec, text)
