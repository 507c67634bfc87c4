"""The goodput policy: a table of decisions that would change if its logic broke."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.costmodel import CostModel, CostTable
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec, PolicySpec, parse_policy
from policies.registry import build_policy
from policies.types import Observation, PoolView, Task
from policies.validation import InvalidDocument

# Shaped like the Qwen3-8B H200 ratios: cheap wide verify at batch 1, ~5x at batch 64.
TABLE = CostTable(
    batch_sizes=(1, 8, 64),
    tokens_per_request=(1, 8, 16),
    step_time_s=((5.5e-3, 6.0e-3, 6.5e-3), (5.8e-3, 7.4e-3, 9.2e-3), (7.8e-3, 26.8e-3, 39e-3)),
)
COST = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.14).snapshot()
QUIET = GoodputSpec(probe_probability=0.0, warmup_steps=0, request_probe_steps=0)


def _obs(task: Task, batch: int, rate: float, **kw: object) -> Observation:
    base = Observation(
        task=task,
        confidence=1.0,
        concurrency=batch,
        min_spec_tokens=4,
        max_spec_tokens=15,
        block_size=16,
        accept_rates=(rate,) * 15,
        accept_trials=(1000.0,) * 15,
        step_cost=COST,
        rng_u=0.99,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("task", "batch", "rate", "want"),
    [
        (Task.MATH, 1, 0.88, 15),  # wide verify is nearly free at batch 1
        (Task.CHAT, 1, 0.8, 15),
        (Task.MATH, 64, 0.88, 7),  # at batch 64 width 16 costs 5x: the shorter block wins
        (Task.CHAT, 64, 0.72, 0),  # and chat acceptance no longer pays for any draft
        (Task.CHAT, 8, 0.2, 0),  # hopeless acceptance: drafting off even when cheap
    ],
)
def test_chooses_k_by_expected_tokens_per_second(
    task: Task, batch: int, rate: float, want: int
) -> None:
    decision = GoodputPolicy(QUIET).decide(_obs(task, batch, rate))
    assert decision.spec_tokens == want, decision.reason
    assert f"k={want}" in decision.reason


def test_own_history_overrides_the_task_estimate() -> None:
    policy = GoodputPolicy(QUIET)
    # A chat request whose drafts keep being fully accepted deserves drafting at batch 64.
    good = _obs(
        Task.CHAT,
        64,
        0.72,
        request_spec_tokens=(7,) * 20,
        request_accept_lengths=(8,) * 20,
        step_index=20,
    )
    assert policy.decide(good).spec_tokens > 0
    # A math request that is rejected at the first position every step stops drafting.
    bad = _obs(
        Task.MATH,
        64,
        0.88,
        request_spec_tokens=(15,) * 20,
        request_accept_lengths=(1,) * 20,
        step_index=20,
    )
    assert policy.decide(bad).spec_tokens == 0


def test_hysteresis_holds_a_nearly_as_good_previous_k() -> None:
    spec = GoodputSpec(probe_probability=0.0, warmup_steps=0, hysteresis=0.5)
    obs = _obs(Task.MATH, 1, 0.88, previous_spec_tokens=7)
    decision = GoodputPolicy(spec).decide(obs)
    assert decision.spec_tokens == 7 and "hold" in decision.reason
    no_hold = GoodputPolicy(QUIET).decide(obs)
    assert no_hold.spec_tokens == 15


def test_warmup_keeps_the_admission_k() -> None:
    spec = GoodputSpec(probe_probability=0.0, warmup_steps=3, hysteresis=0.0)
    obs = _obs(Task.MATH, 1, 0.88, previous_spec_tokens=7, step_index=1)
    assert GoodputPolicy(spec).decide(obs).spec_tokens == 7
    assert GoodputPolicy(spec).decide(replace(obs, step_index=3)).spec_tokens == 15


def test_probes_censored_positions_only_when_rng_says_so_and_data_is_thin() -> None:
    spec = GoodputSpec(
        probe_probability=0.1, probe_min_steps=50, warmup_steps=0, request_probe_steps=0
    )
    policy = GoodputPolicy(spec)
    thin = (1000.0,) * 7 + (3.0,) * 8  # positions 8..15 rarely drafted
    at_64 = _obs(Task.MATH, 64, 0.88, accept_trials=thin)
    assert policy.decide(replace(at_64, rng_u=0.5)).spec_tokens == 7
    probe = policy.decide(replace(at_64, rng_u=0.05))
    assert probe.spec_tokens == 15 and "probe" in probe.reason
    # Well observed positions: no probe even when the coin says so.
    assert policy.decide(replace(at_64, rng_u=0.05, accept_trials=(1000.0,) * 15)).spec_tokens == 7
    # Drafting off probes the smallest captured width.
    chat = _obs(Task.CHAT, 64, 0.72, accept_trials=(3.0,) * 15, rng_u=0.05)
    assert policy.decide(chat).spec_tokens == 7


def test_probes_stop_once_enough_steps_drafted_the_wider_width() -> None:
    """Fault 2 of issue 13: a position is a trial only when every one before it was accepted,
    so 500 steps that drafted width 16 at rate 0.88 leave 500 x 0.88^14 = 84 trials at
    position 15. The old rule (200 trials at every probed position) kept probing; counting
    the steps that drafted the width (trials / chance of reaching the position) stops."""
    spec = GoodputSpec(probe_probability=0.1, warmup_steps=0, request_probe_steps=0)
    drafted = tuple(500.0 * 0.88**j for j in range(15))
    obs = _obs(Task.MATH, 64, 0.88, accept_trials=drafted, rng_u=0.05)
    assert GoodputPolicy(spec).decide(obs).spec_tokens == 7
    # 20 such steps are too few: probe.
    few = tuple(t / 25 for t in drafted)
    assert GoodputPolicy(spec).decide(replace(obs, accept_trials=few)).spec_tokens == 15


def test_a_new_request_tries_drafting_when_off_is_a_close_call() -> None:
    spec = GoodputSpec(probe_probability=0.0, warmup_steps=0, request_probe_steps=2)
    policy = GoodputPolicy(spec)
    close_call = _obs(Task.CHAT, 64, 0.72)  # drafting loses ~20%: worth learning this request
    tried = policy.decide(close_call)
    assert tried.spec_tokens == 7 and "try" in tried.reason
    # After two drafted steps of its own, the request's history decides.
    seen = replace(
        close_call, request_spec_tokens=(7, 7), request_accept_lengths=(1, 2), step_index=2
    )
    assert policy.decide(seen).spec_tokens == 0
    # Hopeless by far more than the margin: no try.
    assert policy.decide(_obs(Task.CHAT, 64, 0.2)).spec_tokens == 0


def test_falls_back_to_priors_and_built_in_cost() -> None:
    obs = Observation(
        task=Task.MATH,
        confidence=1.0,
        concurrency=1,
        min_spec_tokens=4,
        max_spec_tokens=15,
        block_size=16,
        rng_u=0.99,
    )
    decision = GoodputPolicy(GoodputSpec()).decide(obs)
    assert decision.spec_tokens == 15


def test_ranks_pools_by_expected_goodput() -> None:
    pools = (
        PoolView("k15", spec_tokens=15, block_size=16, num_inflight=63),
        PoolView("k7", spec_tokens=7, block_size=16, num_inflight=63),
        PoolView("k0", spec_tokens=0, block_size=16, num_inflight=63),
        PoolView("sick", spec_tokens=7, block_size=16, num_inflight=0, is_healthy=False),
    )
    policy = GoodputPolicy(QUIET)
    math = policy.decide(_obs(Task.MATH, 64, 0.88, pools=pools))
    assert (math.pool, math.spec_tokens) == ("k7", 7)
    chat = policy.decide(_obs(Task.CHAT, 64, 0.72, pools=pools))
    assert chat.pool == "k0"
    # An idle k15 pool beats a loaded k7 pool.
    idle = (replace(pools[0], num_inflight=0), pools[1])
    assert policy.decide(_obs(Task.MATH, 64, 0.88, pools=idle)).pool == "k15"
    # Observed TPOT: a pool measured 3x slower than its table loses.
    slow = (replace(pools[1], tpot_s=3 * 26.8e-3 / 5.3, accept_length=5.3), pools[2])
    assert policy.decide(_obs(Task.MATH, 64, 0.88, pools=slow)).pool == "k0"
    assert policy.decide(_obs(Task.MATH, 64, 0.88, pools=(pools[3],))).pool is None


def test_policy_yaml_validates_goodput_keys() -> None:
    spec = parse_policy(
        "kind: goodput\ngoodput:\n  hysteresis: 0.1\n  prior_accept_rates:\n"
        "    math: [0.9]\n    code: [0.8]\n    chat: [0.7, 0.6]\n"
    )
    assert isinstance(build_policy(spec), GoodputPolicy)
    assert spec.goodput.prior_for(Task.CHAT, 3) == [0.7, 0.6, 0.6]
    with pytest.raises(InvalidDocument) as err:
        parse_policy("kind: goodput\ngoodput:\n  hysteresis: 2\n  probe_rate: 0.1\n")
    text = str(err.value)
    assert "goodput.hysteresis" in text and "line 3" in text
    assert "goodput.probe_rate: unknown key (line 4)" in text
    with pytest.raises(InvalidDocument, match="rates must be in"):
        parse_policy("goodput:\n  prior_accept_rates: {math: [1.2], code: [0.5], chat: [0.5]}\n")
    assert PolicySpec().goodput == GoodputSpec()


def test_a_request_off_for_a_while_drafts_again_to_see_if_its_text_got_easy() -> None:
    spec = GoodputSpec(
        probe_probability=0.0, warmup_steps=0, request_probe_steps=0, request_reprobe_steps=4
    )
    policy = GoodputPolicy(spec)
    close_call = _obs(Task.CHAT, 64, 0.72)  # drafting loses ~20% on the task estimate
    off_for_three = replace(close_call, request_spec_tokens=(7, 0, 0, 0), step_index=4)
    assert policy.decide(off_for_three).spec_tokens == 0
    off_for_four = replace(off_for_three, request_spec_tokens=(7, 0, 0, 0, 0), step_index=5)
    tried = policy.decide(off_for_four)
    assert tried.spec_tokens == 7 and "try" in tried.reason
    # Not when drafting is hopeless, and never with the setting at 0.
    hopeless = replace(off_for_four, accept_rates=(0.2,) * 15)
    assert policy.decide(hopeless).spec_tokens == 0
    never = GoodputPolicy(spec.model_copy(update={"request_reprobe_steps": 0}))
    assert never.decide(off_for_four).spec_tokens == 0
