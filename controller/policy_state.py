"""The running policy: its document, the built Policy object and its version, swapped whole."""

from __future__ import annotations

from dataclasses import dataclass

from policies.model import PolicySpec
from policies.registry import build_policy
from policies.types import Policy


@dataclass(frozen=True)
class RunningPolicy:
    version: int
    spec: PolicySpec
    policy: Policy

    @classmethod
    def build(cls, version: int, spec: PolicySpec) -> RunningPolicy:
        return cls(version, spec, build_policy(spec))

    def describe(self) -> dict[str, int | str]:
        return {"version": self.version, "kind": self.spec.kind}
