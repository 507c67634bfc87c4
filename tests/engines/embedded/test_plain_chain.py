"""``Engine(plain_chain=True)``: a greedy plain burst is followed by the next, queued on the
device before the host reads the first (``ModelRunner.plain_queue`` / ``plain_collect``), so
a call returns the burst the call before queued. Same tokens and finish reasons as single
steps, with rows joining, leaving on a stop token or their length, aborted mid-chain, and
switching to drafting; the draft's context intact after chained bursts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import RequestView, SamplingParams, TokenEvent
from engines.embedded.request import Request
from engines.embedded.runner import DEFERRED_POSITIONS, PlainBurst
from tests.engines.embedded.conftest import BLOCK_SIZE, fixed_k, random_prompt
from tests.engines.embedded.test_lossless import PROMPT_LEN, run_staggered, target_only_greedy
from tests.engines.embedded.test_plain_burst import _engine as burst_engine
from tests.engines.embedded.test_plain_burst import (
    _requests,
    assert_fresh_draft_context,
    plain_then_drafting,
)


def _engine(
    pair: tuple[Path, Path],
    burst: int,
    chain: bool,
    graphs: bool = True,
    defer: bool = True,
    max_batch_size: int = 4,
    burst_graph: int = 0,
) -> Engine:
    """test_plain_burst's engine on graphs with the deferred context, chained or not."""
    return burst_engine(
        pair,
        burst,
        graphs=graphs,
        defer=defer,
        max_batch_size=max_batch_size,
        burst_graph=burst_graph,
        chain=chain,
    )


def _chained(engine: Engine) -> list[int]:
    """The step count of every burst queued behind another (``plain_queue(after=...)``)."""
    sizes: list[int] = []
    queue = engine.runner.plain_queue

    def counted(
        rows: list[Request], steps: int, after: PlainBurst | None = None, **kwargs: Any
    ) -> PlainBurst:
        if after is not None:
            sizes.append(steps)
        return queue(rows, steps, after=after, **kwargs)

    engine.runner.plain_queue = counted  # type: ignore[method-assign]
    return sizes


@pytest.mark.parametrize(
    ("graphs", "defer", "burst_graph", "sampled"),
    [
        (True, True, 0, False),
        (True, True, 4, False),
        (False, True, 0, False),
        (True, False, 0, False),
        (False, False, 0, False),
        (True, True, 0, True),
        (False, True, 4, True),
    ],
)
def test_chained_bursts_give_the_tokens_of_single_steps(
    agreeing_pair: tuple[Path, Path], graphs: bool, defer: bool, burst_graph: int, sampled: bool
) -> None:
    """Greedy rows joining one per step, switching between plain stretches and drafting,
    one leaving on a stop token mid-burst, and (``sampled``) seeded sampled rows that stay
    plain (their draws taken step by step, as single steps take them): single steps, bursts
    of 4, and chained bursts of 4 give the same tokens and finish reasons; bursts were
    chained."""
    outputs = []
    chained: list[int] = []
    for burst, chain in ((1, False), (4, False), (4, True)):
        engine = _engine(
            agreeing_pair, burst, chain, graphs=graphs, defer=defer, burst_graph=burst_graph
        )
        sizes = _chained(engine)
        requests = _requests(sampled)
        run_staggered(engine, requests)
        outputs.append([(r.output_ids, r.finish_reason) for r in requests])
        assert not engine.has_work and engine._chain is None
        if chain:
            chained = sizes
        else:
            assert sizes == []
    assert outputs[0] == outputs[1] == outputs[2]
    assert any(reason == "stop" for _, reason in outputs[0])
    assert len(chained) >= 3, chained


def test_a_call_returns_the_burst_the_call_before_queued(agreeing_pair: tuple[Path, Path]) -> None:
    """Two plain rows: the first decoding call reads one burst and leaves the next queued
    (``_chain``); each later call reads one burst (4 events a row, in order) and queues
    another; a row whose end comes inside a queued burst stops the chain: its events end
    with its finishing one, and its slot is released only once the burst queued behind it is
    read; the planner's k = 0 rows were told every step; step counts add up."""
    engine = _engine(agreeing_pair, 4, True, max_batch_size=2)
    a = Request("a", random_prompt(5, PROMPT_LEN), SamplingParams(30), fixed_k(0), {})
    b = Request("b", random_prompt(6, PROMPT_LEN), SamplingParams(11), fixed_k(0), {})
    engine.add(a)
    engine.add(b)
    events = engine.step()  # the prefills' first tokens, then a burst read and one queued
    assert engine._chain is not None and engine._chain.steps == 4
    assert [len(a.output_ids), len(b.output_ids)] == [5, 5]
    assert len(events) == 2 + 2 * 4
    events = engine.step()  # reads the queued burst (steps 6-9); b needs 2 more: queued
    assert [len(a.output_ids), len(b.output_ids)] == [9, 9]
    assert [e.token_ids for r, e in events if r is b] == [[t] for t in b.output_ids[5:]]
    queued = engine._chain
    assert queued is not None and queued.steps == 4  # the longest row still needs 21
    events = engine.step()  # b's last 2 tokens inside it: b ends, the chain stops behind it
    ends = [e for r, e in events if r is b]
    assert isinstance(ends[-1], TokenEvent) and ends[-1].finished and len(ends) == 2
    assert b.finish_reason == "length" and len(b.output_ids) == 11
    assert engine._chain is None  # b's length ends inside it: nothing queued behind
    assert b.slot == -1 and engine.scheduler.running == [a]
    while engine.has_work:
        engine.step()
    assert len(a.output_ids) == 30 and a.finish_reason == "length"
    counts = engine.step_counts["plain"]
    assert counts.steps >= 29 and counts.round_trips < counts.steps


def test_a_stop_token_inside_a_chained_burst(agreeing_pair: tuple[Path, Path]) -> None:
    """A row that stops on a token inside a burst while the next is queued: its events end
    there; it keeps its slot (the queued burst still writes it) until the next call reads
    that burst, whose tokens for it are dropped; the other row goes on unchanged."""
    prompts = [random_prompt(7 + i, PROMPT_LEN) for i in range(2)]
    reference = target_only_greedy(agreeing_pair[0], prompts, 40)
    # a token first met after the prefill's and the first burst's (inside a later burst)
    cut = next(i for i in range(6, 40) if reference[1][i] not in reference[1][:i]) + 1
    stop = reference[1][cut - 1]
    engine = _engine(agreeing_pair, 4, True, max_batch_size=2)
    a = Request("a", prompts[0], SamplingParams(40), fixed_k(0), {})
    b = Request("b", prompts[1], SamplingParams(40, stop_token_ids=(stop,)), fixed_k(0), {})
    engine.add(a)
    engine.add(b)
    while b.finish_reason is None:
        engine.step()
    assert b.output_ids == reference[1][:cut]
    assert engine._chain is not None  # it ended while a burst was queued behind it
    assert b.slot >= 0 and "b" in engine._chain_ended
    events = engine.step()
    assert not [e for r, e in events if r is b] and b.slot == -1
    while engine.has_work:
        engine.step()
    assert a.output_ids == reference[0] and b.output_ids == reference[1][:cut]


def test_aborts_and_admissions_stop_the_chain(agreeing_pair: tuple[Path, Path]) -> None:
    """An abort while a burst is queued reads it first (the other rows' tokens come with the
    next call; the aborted row's are dropped) and frees the slot; a request added while one
    is queued is admitted after it is read. Every row still decodes target-only greedy."""
    prompts = [random_prompt(20 + i, PROMPT_LEN) for i in range(4)]
    reference = target_only_greedy(agreeing_pair[0], prompts, 30)
    engine = _engine(agreeing_pair, 4, True, max_batch_size=3)
    requests = [
        Request(f"r{i}", p, SamplingParams(30), fixed_k(0), {}) for i, p in enumerate(prompts)
    ]
    for request in requests[:3]:
        engine.add(request)
    engine.step()
    engine.step()
    assert engine._chain is not None
    seen = len(requests[1].output_ids)
    engine.abort("r0")
    assert engine._chain is None and requests[0].slot == -1
    assert len(requests[1].output_ids) == seen + 4  # the queued burst, read by the abort
    held = engine.step()  # its events first, then this call's own
    assert [e.token_ids[0] for r, e in held if r is requests[1]][:4] == (
        requests[1].output_ids[seen : seen + 4]
    )
    assert not [e for r, e in held if r is requests[0]]
    engine.add(requests[3])
    engine.step()  # the queued burst read, then r3 admitted and prefilled
    assert requests[3].slot >= 0
    while engine.has_work:
        engine.step()
    for request, expected in zip(requests[1:], reference[1:], strict=True):
        assert request.output_ids == expected, request.request_id
    assert requests[0].output_ids == reference[0][: len(requests[0].output_ids)]


def test_rows_aborted_after_the_chain_was_read_leave_no_events(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """Aborting every row of a chained batch in turn (as the start-up profile does after each
    plain point): the first abort reads the queued burst and holds the others' events; each
    later abort drops its own, so the next call returns none of theirs and the engine idles."""
    prompts = [random_prompt(40 + i, PROMPT_LEN) for i in range(3)]
    engine = _engine(agreeing_pair, 4, True, max_batch_size=3)
    requests = [
        Request(f"q{i}", p, SamplingParams(30), fixed_k(0), {}) for i, p in enumerate(prompts)
    ]
    for request in requests:
        engine.add(request)
    engine.step()
    engine.step()
    assert engine._chain is not None
    engine.abort("q0")
    assert {r.request_id for r, _ in engine._held_events} == {"q1", "q2"}
    engine.abort("q1")
    assert {r.request_id for r, _ in engine._held_events} == {"q2"}
    engine.abort("q2")
    assert not engine.has_work and engine.step() == []
    assert all(r.slot == -1 for r in requests)


def test_a_drafting_plan_stops_the_chain(agreeing_pair: tuple[Path, Path]) -> None:
    """A row planned to draft again (its controller asked while a burst is queued, one burst
    stale) stops the chain: the queued burst is read, the next call drafts; tokens are
    target-only greedy."""
    prompt = random_prompt(40, PROMPT_LEN)
    reference = target_only_greedy(agreeing_pair[0], [prompt], 60)[0]

    def controller(view: RequestView) -> int:
        return BLOCK_SIZE - 1 if 20 <= view.num_generated < 30 else 0

    engine = _engine(agreeing_pair, 4, True, max_batch_size=1)
    sizes = _chained(engine)
    request = Request("d", prompt, SamplingParams(60), controller, {})
    engine.add(request)
    while engine.has_work:
        engine.step()
    assert request.output_ids == reference
    drafted = [i for i, k in enumerate(request.spec_tokens) if k]
    assert drafted and sizes


def test_the_draft_context_after_chained_bursts_is_a_fresh_prefill(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """After 2 * DEFERRED_POSITIONS + 3 tokens in chained bursts (the stash filled and
    inserted between two queued bursts, at the positions the first leaves), the draft's cache
    holds what a fresh prefill writes; drafting then accepts long runs."""
    engine = _engine(agreeing_pair, 5, True, max_batch_size=1)
    sizes = _chained(engine)
    plain_for = 2 * DEFERRED_POSITIONS + 3
    request = plain_then_drafting(plain_for)
    engine.add(request)
    while len(request.output_ids) < plain_for:
        engine.step()
    assert len(sizes) >= 4
    while engine._chain is not None:  # the controller now drafts: the chain stops
        engine.step()
    assert_fresh_draft_context(agreeing_pair, engine, request)


def test_what_does_not_chain(agreeing_pair: tuple[Path, Path]) -> None:
    """Single-step engines and the chain off queue nothing behind a burst; ``plain_queue``
    refuses a sampled row without its bonus uniforms, other rows than the burst it follows
    and bad step counts."""
    for burst, chain, temperature in ((1, True, 0.8), (4, False, 0.8), (1, True, 0.0)):
        engine = _engine(agreeing_pair, burst, chain, max_batch_size=1)
        sizes = _chained(engine)
        params = SamplingParams(20, temperature=temperature, seed=1)
        engine.add(Request("s", random_prompt(50, PROMPT_LEN), params, fixed_k(0), {}))
        while engine.has_work:
            engine.step()
            assert engine._chain is None
        assert sizes == []
    runner = _engine(agreeing_pair, 4, True, max_batch_size=2).runner
    greedy = Request("g", random_prompt(51, PROMPT_LEN), SamplingParams(20), fixed_k(0), {})
    sampled = Request(
        "t", random_prompt(52, PROMPT_LEN), SamplingParams(20, temperature=0.5), fixed_k(0), {}
    )
    for slot, request in enumerate((greedy, sampled)):
        request.slot = slot
        request.append([runner.prefill(request, torch.zeros(2 * BLOCK_SIZE + 1))])
    with pytest.raises(ValueError, match="bonus uniforms"):
        runner.plain_queue([greedy, sampled], 4)
    with pytest.raises(ValueError, match="bonus uniforms"):
        runner.plain_queue([greedy, sampled], 4, bonus=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="steps"):
        runner.plain_queue([greedy], DEFERRED_POSITIONS + 1)
    first = runner.plain_queue([greedy], 4)
    with pytest.raises(ValueError, match="same rows"):
        runner.plain_queue([Request("h", [1], SamplingParams(5), fixed_k(0), {})], 4, after=first)
    assert len(runner.plain_collect(first)) == 4


def test_an_abort_leaves_the_other_rows_events_to_the_next_step(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """An abort that reads the queued burst in which the other row ends: that row's last
    events wait for the next ``step`` (``has_work`` says so), though no row is left to step."""
    prompts = [random_prompt(60 + i, PROMPT_LEN) for i in range(2)]
    engine = _engine(agreeing_pair, 4, True, max_batch_size=2)
    a = Request("a", prompts[0], SamplingParams(40), fixed_k(0), {})
    b = Request("b", prompts[1], SamplingParams(9), fixed_k(0), {})
    engine.add(a)
    engine.add(b)
    engine.step()  # first tokens, steps 2-5 read, 6-9 queued: b's last four
    assert engine._chain is not None and engine._chain.steps == 4
    engine.abort("a")
    assert b.finish_reason == "length" and not engine.scheduler.running
    assert engine.has_work
    events = engine.step()
    assert [e.token_ids[0] for r, e in events if r is b] == b.output_ids[5:]
    assert not engine.has_work
