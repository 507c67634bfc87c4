"""Build the running policy object from a validated policy document."""

from __future__ import annotations

from collections.abc import Callable

from policies.goodput import GoodputPolicy
from policies.model import PolicySpec
from policies.static import StaticPolicy
from policies.types import Policy


def _static(spec: PolicySpec) -> Policy:
    return StaticPolicy(spec.static)


def _goodput(spec: PolicySpec) -> Policy:
    return GoodputPolicy(spec.goodput)


_BUILDERS: dict[str, Callable[[PolicySpec], Policy]] = {"static": _static, "goodput": _goodput}


def build_policy(spec: PolicySpec) -> Policy:
    try:
        builder = _BUILDERS[spec.kind]
    except KeyError:
        raise ValueError(f"policy kind {spec.kind!r} has no implementation") from None
    return builder(spec)
