"""The static policy and the policy document model."""

from __future__ import annotations

import pytest

from policies.model import PolicySpec, parse_policy
from policies.registry import build_policy
from policies.static import StaticPolicy
from policies.types import Observation, Task, clamp_spec_tokens
from policies.validation import InvalidDocument


def _obs(task: Task, concurrency: int, max_k: int = 15) -> Observation:
    return Observation(
        task=task,
        confidence=1.0,
        concurrency=concurrency,
        min_spec_tokens=4,
        max_spec_tokens=max_k,
        block_size=max_k + 1,
    )


@pytest.mark.parametrize(
    ("task", "concurrency", "want"),
    [
        (Task.MATH, 1, 15),
        (Task.MATH, 8, 15),
        (Task.MATH, 9, 15),
        (Task.MATH, 33, 7),
        (Task.CODE, 200, 4),
        (Task.CHAT, 1, 7),
        (Task.CHAT, 20, 4),
        (Task.CHAT, 64, 4),
        (Task.CHAT, 65, 0),
        (Task.CHAT, 0, 7),
    ],
)
def test_default_table(task: Task, concurrency: int, want: int) -> None:
    policy = build_policy(PolicySpec())
    decision = policy.decide(_obs(task, concurrency))
    assert decision.spec_tokens == want
    assert f"task={task.value}" in decision.reason


def test_max_resolves_to_block_bound_and_clamps() -> None:
    policy = StaticPolicy(PolicySpec().static)
    assert policy.decide(_obs(Task.MATH, 1, max_k=7)).spec_tokens == 7
    # 7 for chat at low load is clamped to a block-4 draft's ceiling of 3 ...
    assert policy.decide(_obs(Task.CHAT, 1, max_k=3)).spec_tokens == 3


def test_clamp_keeps_zero() -> None:
    assert clamp_spec_tokens(0, 4, 15) == 0
    assert clamp_spec_tokens(2, 4, 15) == 4
    assert clamp_spec_tokens(99, 4, 15) == 15


def test_bounds_for_block_size() -> None:
    spec = PolicySpec(min_spec_tokens=4, max_spec_tokens=10)
    assert spec.bounds_for(16) == (4, 10)
    assert spec.bounds_for(8) == (4, 7)
    assert spec.bounds_for(4) == (3, 3)


def test_problems_name_key_and_line() -> None:
    text = "kind: static\nbogus: 1\nstatic:\n  concurrency_bands: [8, 4]\n"
    with pytest.raises(InvalidDocument) as info:
        parse_policy(text)
    lines = sorted(str(p) for p in info.value.problems)
    assert lines == [
        "bogus: unknown key (line 2)",
        "static.concurrency_bands: Value error, band edges must be strictly ascending (line 4)",
    ]


def test_row_length_must_match_bands() -> None:
    text = (
        "static:\n  concurrency_bands: [8]\n"
        "  spec_tokens: {math: [max, 4], code: [max], chat: [4, 0]}\n"
    )
    with pytest.raises(InvalidDocument) as info:
        parse_policy(text)
    assert "spec_tokens.code has 1 entries" in str(info.value)


def test_invalid_yaml_reports_line() -> None:
    with pytest.raises(InvalidDocument) as info:
        parse_policy("kind: static\nstatic: [\n")
    problem = info.value.problems[0]
    assert problem.message.startswith("invalid YAML")
    assert problem.line is not None


def test_min_above_max_rejected() -> None:
    with pytest.raises(InvalidDocument, match="max_spec_tokens"):
        parse_policy("min_spec_tokens: 8\nmax_spec_tokens: 5\n")


def test_negative_k_rejected() -> None:
    text = (
        "static:\n  spec_tokens:\n"
        "    {math: [max, max, 7, -1], code: [1, 1, 1, 1], chat: [1, 1, 1, 1]}\n"
    )
    with pytest.raises(InvalidDocument, match="k must be >= 0"):
        parse_policy(text)
