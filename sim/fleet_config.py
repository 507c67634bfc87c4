"""The ``fleet`` section of a scenario: N engine instances, how they are pooled and routed.

Every fleet of a scenario runs on the same requests (the scenario's phases: ``concurrency``
counts the whole fleet's clients). The standard uniform fleets (no-spec, static k, one
batch-size schedule, vLLM's adaptive verification) behind least-loaded routing are built
from ``instances``; ``layouts`` adds pooled fleets such as draftctl's task pools.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.types import Task

KMode = Literal["fixed", "schedule", "vllm-av", "oracle", "ragged-vllm-av", "ragged-allocator"]
RAGGED_MODES = ("ragged-vllm-av", "ragged-allocator")
RouterKind = Literal["round-robin", "least-loaded", "task-pools"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolLayout(Section):
    name: str = Field(min_length=1)
    instances: int = Field(ge=1)
    # task-pools router: the tasks whose requests go to this pool first.
    tasks: list[Task] = Field(default_factory=list)
    # fixed: every step runs spec_tokens. schedule: vLLM's num_speculative_tokens_per_batch_size
    # fitted to this pool's task mix (what `draftctl policy export-schedule` prints), capped at
    # spec_tokens. vllm-av: vLLM's adaptive verification (policies/baselines/vllm_av.py).
    # oracle: a bound, not a policy: per step the one k that emits the most tokens per second
    # given every row's accepted run, known ahead (sim/choosers.py Oracle, padded).
    # ragged-vllm-av / ragged-allocator: servers that verify each row at its own k (vLLM's Model
    # Runner V2) with vLLM's adaptive verification or draftctl's per-slot allocator, both
    # reading the draft's confidence (synthetic, acceptance.confidence_auc; sim/ragged_choosers.py).
    k_mode: KMode = "schedule"
    # The servers' num_speculative_tokens; default for schedule / vllm-av: the block's largest
    # k, lowered by one where two task pools would share it (the gateway routes by k).
    spec_tokens: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _fixed_needs_k(self) -> PoolLayout:
        if self.k_mode == "fixed" and self.spec_tokens is None:
            raise ValueError("k_mode fixed needs spec_tokens (the k every step runs)")
        return self


class FleetLayout(Section):
    name: str = Field(min_length=1)
    router: RouterKind = "task-pools"
    # task-pools: a request leaves its home pool when the home pool's least-loaded instance
    # holds more than this many requests above the fleet's least-loaded one; null: never.
    spill_margin: int | None = Field(default=None, ge=0)
    pools: list[PoolLayout] = Field(min_length=1)

    @property
    def num_instances(self) -> int:
        return sum(p.instances for p in self.pools)

    @model_validator(mode="after")
    def _homes(self) -> FleetLayout:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique, got {names}")
        if self.router != "task-pools":
            return self
        homes = [t for p in self.pools for t in p.tasks]
        if len(set(homes)) != len(homes):
            raise ValueError("a task may have one home pool only")
        missing = [t.value for t in Task if t not in homes]
        if missing:
            raise ValueError(f"router task-pools needs a home pool for every task: {missing}")
        return self


class FleetSpec(Section):
    instances: int = Field(ge=1)
    # Router of the standard uniform fleets.
    uniform_router: RouterKind = "least-loaded"
    # One uniform-static-k<N> fleet per k.
    static_spec_tokens: list[int] = Field(default_factory=lambda: [4, 7, 11, 15])
    include_vllm_av: bool = True
    # uniform-oracle: the clairvoyant per-step k on every instance (a bound, see k_mode).
    include_oracle: bool = True
    layouts: list[FleetLayout] = Field(default_factory=list)

    @model_validator(mode="after")
    def _sizes(self) -> FleetSpec:
        for layout in self.layouts:
            if layout.num_instances != self.instances:
                raise ValueError(
                    f"layout {layout.name!r} has {layout.num_instances} instances, the fleet "
                    f"{self.instances}"
                )
            if layout.router != "task-pools" and layout.spill_margin is not None:
                raise ValueError(f"layout {layout.name!r}: spill_margin needs router task-pools")
        return self
