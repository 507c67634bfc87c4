"""Build the running policy object from a validated policy document."""

from __future__ import annotations

from collections.abc import Callable

from policies.model import PolicySpec
from policies.static import StaticPolicy
from policies.types import Policy


def _static(spec: PolicySpec) -> Policy:
    return StaticPolicy(spec.static)


_BUILDERS: dict[str, Callable[[PolicySpec], Policy]] = {"static": _static}


def build_policy(spec: PolicySpec) -> Policy:
    try:
        builder = _BUILDERS[spec.kind]
    except KeyError:
        raise ValueError(f"policy kind {spec.kind!r} has no implementation") from None
    return builder(spec)
