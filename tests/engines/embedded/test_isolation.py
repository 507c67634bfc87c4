"""Engine failure isolation: bad input refused at add, a failing request ends alone (prefill,
preparation, a row of the batched step), the others emit exactly what they emit alone, and no
slot or generator is left behind."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import RequestFailed, SamplingParams, TokenEvent
from engines.embedded.request import Request
from tests.engines.embedded.conftest import BLOCK_SIZE, fixed_k, make_engine, random_prompt

Outcome = list[TokenEvent | RequestFailed]


def greedy(name: str, seed: int = 0, k: int = 5) -> Request:
    return Request(name, random_prompt(seed), SamplingParams(max_new_tokens=16), fixed_k(k), {})


def sampled(name: str, seed: int = 0, k: int = 3) -> Request:
    params = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=100 + seed)
    return Request(name, random_prompt(seed), params, fixed_k(k), {})


def run(engine: Engine, requests: list[Request], unchecked: tuple[Request, ...] = ()) -> dict:
    """Add ``requests`` (and queue ``unchecked`` past ``add``'s checks); step to the end."""
    for request in requests:
        engine.add(request)
    for request in unchecked:
        engine.scheduler.add(request)
    outcomes: dict[str, Outcome] = defaultdict(list)
    while engine.has_work:
        for request, event in engine.step():
            outcomes[request.request_id].append(event)
    assert_nothing_left(engine)
    return outcomes


def assert_nothing_left(engine: Engine) -> None:
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert engine._generators == {}


def alone(pair, make: Callable[[], Request]) -> list[int]:
    request = make()
    run(make_engine(pair), [request])
    return request.output_ids


def assert_failed_alone(outcome: Outcome, stage: str, cause: type[BaseException]) -> None:
    failure = outcome[-1]
    assert isinstance(failure, RequestFailed) and failure.stage == stage
    assert isinstance(failure.__cause__, cause)
    assert all(isinstance(e, TokenEvent) and not e.finished for e in outcome[:-1])


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        ([99999, 1], r"prompt_ids\[0\]=99999"),
        ([-1, 1], r"prompt_ids\[0\]=-1"),
        ([1, 320], r"prompt_ids\[1\]=320: .* \[0, 320\)"),  # the tiny target's vocabulary
        ([1, 2.0], r"prompt_ids\[1\]=2.0"),
        ([1, True], r"prompt_ids\[1\]=True"),
        ([], "prompt_ids is empty"),
    ],
)
def test_bad_prompt_ids_are_refused_at_add(tiny_pair, prompt, field) -> None:
    engine = make_engine(tiny_pair)
    with pytest.raises(ValueError, match=field):
        engine.add(Request("bad", prompt, SamplingParams(max_new_tokens=4), fixed_k(1), {}))
    assert_nothing_left(engine)


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"seed": "abc"}, "seed"),
        ({"seed": [1]}, "seed"),
        ({"seed": 2**64 + 5}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"top_k": 1180591620717411303424}, "top_k"),
        ({"top_k": -1}, "top_k"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": math.nan}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, "max_new_tokens"),
        ({"stop_token_ids": "5"}, "stop_token_ids"),
    ],
)
def test_bad_sampling_params_are_refused_naming_the_field(fields, name) -> None:
    values = {"max_new_tokens": 4, **fields}
    with pytest.raises(ValueError, match=f"^{name}="):
        SamplingParams(**values)


@pytest.mark.parametrize("seed", [-(2**63), -1, 0, 2**64 - 1])
def test_every_seed_torch_accepts_runs(tiny_pair, seed) -> None:
    params = SamplingParams(max_new_tokens=3, temperature=1.0, seed=seed)
    request = Request("r", random_prompt(1), params, fixed_k(2), {})
    run(make_engine(tiny_pair), [request])
    assert len(request.output_ids) == 3


def test_a_seed_that_slipped_past_the_checks_is_refused_at_add(tiny_pair) -> None:
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=1)
    object.__setattr__(params, "seed", 2**64 + 5)  # as if SamplingParams had not checked it
    engine = make_engine(tiny_pair)
    with pytest.raises(ValueError, match="seed=18446744073709551621"):
        engine.add(Request("bad", [1, 2], params, fixed_k(1), {}))
    assert_nothing_left(engine)


def test_a_prefill_that_raises_fails_only_its_request(agreeing_pair) -> None:
    """A token id past the vocabulary that got past ``add`` (IndexError in the embedding)."""
    makers = [lambda: greedy("a", 1), lambda: sampled("b", 2), lambda: greedy("c", 3, k=0)]
    expected = [alone(agreeing_pair, make) for make in makers]
    good = [make() for make in makers]
    bad = Request("bad", [99999, 1], SamplingParams(max_new_tokens=4), fixed_k(3), {})
    outcomes = run(make_engine(agreeing_pair), good[:2], unchecked=(bad, good[2]))
    assert_failed_alone(outcomes["bad"], "prefill", IndexError)
    assert len(outcomes["bad"]) == 1
    assert [r.output_ids for r in good] == expected


def poison_step(
    monkeypatch: pytest.MonkeyPatch, engine: Engine, bad_ids: set[str], after_tokens: int
) -> list[int]:
    """Make the runner's step raise whenever a row of ``bad_ids`` with at least
    ``after_tokens`` outputs is in the batch; return the batch sizes of the probe calls."""
    real_step = engine.runner.step
    probes: list[int] = []

    def step(rows, spec_tokens, uniforms, eager=False, overlap=None):
        if eager:
            probes.append(len(rows))
        if any(r.request_id in bad_ids and len(r.output_ids) >= after_tokens for r in rows):
            raise RuntimeError("injected step failure")
        return real_step(rows, spec_tokens, uniforms, eager=eager, overlap=overlap)

    monkeypatch.setattr(engine.runner, "step", step)
    return probes


@pytest.mark.parametrize("bad_rows", [(0,), (1,), (3,), (1, 2)])
def test_a_step_row_that_raises_fails_only_its_request(
    agreeing_pair, monkeypatch, bad_rows
) -> None:
    """Four rows share every step; the poisoned ones fail after a few tokens, the others emit
    exactly their solo tokens (greedy and seeded sampling: the re-run step reuses the uniforms,
    and the discarded attempts left nothing in the caches that a later step reads)."""
    makers = [lambda: greedy("r0", 1), lambda: sampled("r1", 2), lambda: greedy("r2", 3, 0)]
    makers.append(lambda: sampled("r3", 4, BLOCK_SIZE - 1))
    expected = [alone(agreeing_pair, make) for make in makers]
    engine = make_engine(agreeing_pair)
    bad_ids = {f"r{i}" for i in bad_rows}
    probes = poison_step(monkeypatch, engine, bad_ids, after_tokens=3)
    requests = [make() for make in makers]
    outcomes = run(engine, requests)
    for i, request in enumerate(requests):
        if request.request_id in bad_ids:
            assert_failed_alone(outcomes[request.request_id], "step", RuntimeError)
            assert len(request.output_ids) >= 3
        else:
            assert request.output_ids == expected[i]
            assert outcomes[request.request_id][-1].finished
    assert 0 < len(probes) <= 2 * len(bad_rows)  # bisection: log2(4) probes per culprit


def test_a_lone_row_that_raises_fails_without_probes(agreeing_pair, monkeypatch) -> None:
    engine = make_engine(agreeing_pair)
    probes = poison_step(monkeypatch, engine, {"r"}, after_tokens=1)
    outcomes = run(engine, [greedy("r")])
    assert_failed_alone(outcomes["r"], "step", RuntimeError)
    assert probes == []


def test_a_failed_preparation_fails_only_its_request(agreeing_pair, monkeypatch) -> None:
    makers = [lambda: sampled("a", 1), lambda: greedy("b", 2)]
    expected = [alone(agreeing_pair, make) for make in makers]
    engine = make_engine(agreeing_pair)
    real_uniforms = engine._uniforms

    def uniforms(request: Request) -> torch.Tensor:
        if request.request_id == "bad" and len(request.output_ids) >= 2:
            raise RuntimeError("injected")
        return real_uniforms(request)

    monkeypatch.setattr(engine, "_uniforms", uniforms)
    requests = [make() for make in makers]
    outcomes = run(engine, [requests[0], sampled("bad", 5), requests[1]])
    assert_failed_alone(outcomes["bad"], "prepare", RuntimeError)
    assert [r.output_ids for r in requests] == expected


def test_a_raising_controller_costs_its_request_only_drafting(agreeing_pair, caplog) -> None:
    """Controllers degrade to k = 0 (logged once): k changes speed, never tokens."""

    def broken(view) -> int:
        raise RuntimeError("policy bug")

    expected = [
        alone(agreeing_pair, lambda: greedy("a", 1)),
        alone(agreeing_pair, lambda: greedy("b", 2)),
    ]
    a, b = greedy("a", 1), greedy("b", 2)
    b.controller = broken
    outcomes = run(make_engine(agreeing_pair), [a, b])
    assert [a.output_ids, b.output_ids] == expected
    assert all(e.report.spec_tokens == 0 for e in outcomes["b"][1:])
    assert b.num_controller_failures == len(outcomes["b"]) - 1
    assert caplog.text.count("spec controller failed") == 1


def test_a_discarded_step_leaves_committed_cache_positions_as_they_were(agreeing_pair) -> None:
    """The invariant the culprit search relies on, checked on the caches directly: dropped
    steps write only at or after each row's position, a probe only its own rows' slots, and
    the requests then finish with their solo tokens."""
    expected = [alone(agreeing_pair, lambda i=i: greedy(f"r{i}", i)) for i in range(3)]
    engine = make_engine(agreeing_pair)
    requests = [greedy(f"r{i}", i) for i in range(3)]
    for request in requests:
        engine.add(request)
    engine.step()
    engine.step()
    caches = [
        kv
        for cache in (engine.runner.target_cache, engine.runner.draft_cache)
        for kv in (cache.k, cache.v)
    ]

    def committed() -> list[torch.Tensor]:
        return [kv[:, r.slot, :, : r.position].clone() for r in requests for kv in caches]

    before = committed()
    uniforms = torch.rand(3, 2 * BLOCK_SIZE + 1)
    engine.runner.step(requests, [BLOCK_SIZE - 1, 3, 0], uniforms)  # result dropped
    slot_2 = [kv[:, 2].clone() for kv in caches]
    engine.runner.step(requests[:2], [BLOCK_SIZE - 1, 5], uniforms[:2], eager=True)  # a probe
    assert all(torch.equal(x, y) for x, y in zip(before, committed(), strict=True))
    assert all(torch.equal(x, kv[:, 2]) for x, kv in zip(slot_2, caches, strict=True))
    while engine.has_work:
        engine.step()
    assert [r.output_ids for r in requests] == expected


def test_aborting_leaves_nothing_behind(tiny_pair) -> None:
    engine = make_engine(tiny_pair, max_batch_size=1)
    running, waiting = sampled("running", 1), sampled("waiting", 2)
    engine.add(running)
    engine.add(waiting)
    engine.step()
    assert engine.scheduler.waiting  # beyond max_batch_size
    engine.abort("waiting")
    engine.abort("running")
    assert_nothing_left(engine)
