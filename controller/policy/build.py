"""``validate_and_build``: the one decision whether a policy text is accepted.

The admin API (PUT and validate), the file watcher and ``draftctl config check`` all call it,
so all three accept and reject the same texts. Accepting means more than a valid document:
the policy object is built and, for ``goodput``, its online models with the ``cost_table``
they read, exactly as the daemon would run them. Each edit is built once; the store keeps
the result and the daemon runs that object.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from controller.policy.document import check_text
from engines.cost_tables import goodput_cost_table
from policies.model import PolicySpec, parse_policy
from policies.online import OnlineModels
from policies.registry import build_policy
from policies.types import Policy
from policies.validation import InvalidDocument, Problem, parse_yaml

# The draft block size assumed when no backend says otherwise (config check, tests).
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class BuiltPolicy:
    """A validated policy document and the objects built from it, ready to run."""

    spec: PolicySpec
    policy: Policy
    # Learned acceptance and step cost (goodput policy only; a new version starts afresh).
    models: OnlineModels | None = None


def validate_and_build(
    text: str, *, block_size: int = DEFAULT_BLOCK_SIZE, base_dir: Path = Path(".")
) -> BuiltPolicy:
    """Parse, validate and build ``text``; raises InvalidDocument listing every problem.

    ``block_size``: the fleet's largest draft block; ``base_dir``: the policy file's folder
    (a goodput ``cost_table`` path is relative to it).
    """
    check_text(text)
    spec = parse_policy(text)
    return build_spec(spec, block_size=block_size, base_dir=base_dir, text=text)


def build_spec(
    spec: PolicySpec,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    base_dir: Path = Path("."),
    text: str = "",
) -> BuiltPolicy:
    """Build an already validated ``spec``; ``text`` (its YAML) only gives problems a line."""
    try:
        policy = build_policy(spec)
    except ValueError as exc:
        raise InvalidDocument([_problem(text, "kind", str(exc))]) from exc
    if spec.kind != "goodput":
        return BuiltPolicy(spec, policy)
    try:
        table = goodput_cost_table(spec.goodput, base_dir)
        models = OnlineModels(spec.goodput, block_size, table)
    except (ValueError, OSError) as exc:  # e.g. a cost_table that is missing or not JSON
        key = "goodput.cost_table" if spec.goodput.cost_table else "goodput"
        raise InvalidDocument([_problem(text, key, str(exc))]) from exc
    return BuiltPolicy(spec, policy, models)


def _problem(text: str, key: str, message: str) -> Problem:
    """A build problem at dotted ``key``, with the key's line in ``text`` when it has one."""
    lines: dict[tuple[str, ...], int] = {}
    if text:
        try:
            lines = parse_yaml(text)[1]
        except InvalidDocument:
            pass  # cannot happen for a text that validated; the problem just has no line
    return Problem(key, message, lines.get(tuple(key.split("."))))
