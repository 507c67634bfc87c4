"""The running policy: its document, the built Policy object, its version and, for the goodput
policy, the online models it learns from finished requests. Swapped whole on every change;
the gateway and the engine read it on every request."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.policy.build import DEFAULT_BLOCK_SIZE, BuiltPolicy, build_spec
from engines.base import Outcome
from policies.model import PolicySpec
from policies.online import OnlineModels
from policies.types import Policy, Task


@dataclass(frozen=True)
class RunningPolicy:
    version: int
    spec: PolicySpec
    policy: Policy
    # Learned acceptance and step cost (goodput policy only; a new version starts afresh).
    models: OnlineModels | None = None

    @classmethod
    def of(cls, version: int, built: BuiltPolicy) -> RunningPolicy:
        """``built`` (from ``validate_and_build``) running as ``version``."""
        return cls(version, built.spec, built.policy, built.models)

    @classmethod
    def build(
        cls,
        version: int,
        spec: PolicySpec,
        block_size: int = DEFAULT_BLOCK_SIZE,
        base_dir: Path = Path("."),
    ) -> RunningPolicy:
        """Build a validated ``spec`` (tests, tools); raises InvalidDocument.
        ``block_size``: the fleet's largest draft block; ``base_dir``: the policy file's
        folder (a goodput ``cost_table`` path is relative to it)."""
        return cls.of(version, build_spec(spec, block_size=block_size, base_dir=base_dir))

    def describe(self) -> dict[str, int | str]:
        return {"version": self.version, "kind": self.spec.kind}

    def observe(self, task: Task) -> dict[str, Any] | None:
        """Observation fields from the online models (None: use the windowed stats)."""
        return None if self.models is None else self.models.observe(task)

    def learn(
        self,
        task: Task,
        spec_tokens: int,
        outcome: Outcome,
        concurrency: int,
        tpot_s: float | None,
    ) -> None:
        """Feed one finished request to the online models (no-op without them, or when the
        backend learned its steps itself)."""
        if self.models is None or outcome.is_learned:
            return
        self.models.record_outcome(
            task,
            outcome.step_spec_tokens or spec_tokens,  # per step (embedded) or the pool's k
            accept_lengths=outcome.accept_lengths,
            accepted_per_position=outcome.accepted_per_position,
            num_drafts=outcome.num_drafts or 0,
            step_times_s=outcome.step_times_s,
            tpot_s=tpot_s,
            batch_size=concurrency,
        )
