"""AsyncEngine under failure: a bad or failing request ends alone while others stream on, a
crash of the loop itself reaches every waiting stream at once and the loop restarts, and the
health view (``is_alive``, ``seconds_since_progress``) shows a stalled or dead loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engines.embedded import AsyncEngine, EngineClosed, SamplingParams, TokenEvent
from engines.embedded.events import RequestFailed
from tests.engines.embedded.conftest import fixed_k, random_prompt

TIMEOUT_S = 20.0  # "promptly": far below any request timeout, generous for a loaded CPU

SEEDED = SamplingParams(max_new_tokens=24, temperature=0.8, top_p=0.95, seed=3)


@pytest.fixture
async def engine(agreeing_pair):
    engine = AsyncEngine.load(
        agreeing_pair[0], agreeing_pair[1], device="cpu", max_batch_size=4, max_seq_len=128
    )
    yield engine
    await engine.close()


async def tokens(engine: AsyncEngine, prompt, params=SEEDED, context=None) -> list[int]:
    stream = engine.generate(prompt, params, fixed_k(5), context)
    events: list[TokenEvent] = [e async for e in stream]
    assert events[-1].finished
    return [t for e in events for t in e.token_ids]


async def drain(stream) -> list[int]:
    return [t async for e in stream for t in e.token_ids]


def assert_idle(engine: AsyncEngine) -> None:
    scheduler = engine._engine.scheduler
    assert not scheduler.running and not scheduler.waiting and not engine._sinks


async def test_bad_requests_are_refused_while_another_streams(engine) -> None:
    prompt = random_prompt(1)
    expected = await tokens(engine, prompt)
    stream = engine.generate(prompt, SEEDED, fixed_k(5))
    first = await anext(stream)  # running
    for bad_prompt in ([99999, 1], [-1, 1]):
        with pytest.raises(ValueError, match=r"prompt_ids\[0\]"):
            await tokens(engine, bad_prompt, SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="seed="):
        SamplingParams(max_new_tokens=4, seed=1.5)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=1)
    object.__setattr__(params, "seed", 2**64 + 5)  # past SamplingParams: refused on the thread
    with pytest.raises(ValueError, match="seed="):
        await tokens(engine, [1, 2], params)
    assert first.token_ids + await drain(stream) == expected
    assert engine.num_loop_restarts == 0 and engine.is_alive()
    assert_idle(engine)


@pytest.mark.parametrize("stage", ["prefill", "step"])
async def test_a_request_failing_in_the_engine_ends_alone(engine, monkeypatch, stage) -> None:
    prompt = random_prompt(2)
    expected = await tokens(engine, prompt)
    runner = engine._engine.runner
    real = getattr(runner, stage)

    min_tokens = 2 if stage == "step" else 0  # a step fails mid-stream

    def poisoned(target, *args, **kwargs):
        rows = target if stage == "step" else [target]
        if any(r.context.get("poison") and len(r.output_ids) >= min_tokens for r in rows):
            raise RuntimeError(f"injected {stage} failure")
        return real(target, *args, **kwargs)

    monkeypatch.setattr(runner, stage, poisoned)
    if stage == "prefill":  # requests admitted together are prefilled in one forward first
        real_many = runner.prefill_many

        def poisoned_many(targets, *args, **kwargs):
            if any(r.context.get("poison") for r in targets):
                raise RuntimeError("injected prefill failure")
            return real_many(targets, *args, **kwargs)

        monkeypatch.setattr(runner, "prefill_many", poisoned_many)
    good = asyncio.create_task(tokens(engine, prompt))
    with pytest.raises(RequestFailed, match=f"failed in {stage}: RuntimeError") as failed:
        await asyncio.wait_for(
            tokens(engine, random_prompt(3), SamplingParams(max_new_tokens=24), {"poison": True}),
            TIMEOUT_S,
        )
    assert failed.value.stage == stage
    assert await asyncio.wait_for(good, TIMEOUT_S) == expected
    assert engine.num_loop_restarts == 0
    assert_idle(engine)


async def test_a_loop_crash_fails_waiting_streams_at_once_and_restarts(engine, monkeypatch) -> None:
    prompt = random_prompt(4)
    expected = await tokens(engine, prompt)
    real_step = engine._engine.step
    crash = threading.Event()

    def step():
        if crash.is_set():
            crash.clear()
            raise RuntimeError("bookkeeping bug")
        return real_step()

    monkeypatch.setattr(engine._engine, "step", step)
    streams = [engine.generate(random_prompt(5 + i), SEEDED, fixed_k(3)) for i in range(2)]
    for stream in streams:
        await anext(stream)  # both running
    started = time.monotonic()
    crash.set()
    for stream in streams:
        with pytest.raises(RequestFailed, match="engine loop: RuntimeError: bookkeeping bug"):
            await asyncio.wait_for(drain(stream), TIMEOUT_S)
    assert time.monotonic() - started < TIMEOUT_S
    assert engine.is_alive() and engine.num_loop_restarts == 1
    assert await tokens(engine, prompt) == expected
    assert_idle(engine)


async def test_a_crash_while_adding_does_not_strand_the_request(engine, monkeypatch) -> None:
    """The crashed command was already taken from the inbox: its stream must still end."""
    prompt = random_prompt(6)
    expected = await tokens(engine, prompt)
    real_add = engine._engine.add

    def add(request):
        if request.context.get("crash"):
            raise RuntimeError("add bug")
        real_add(request)

    monkeypatch.setattr(engine._engine, "add", add)
    with pytest.raises(RequestFailed, match="engine loop"):
        await asyncio.wait_for(tokens(engine, prompt, context={"crash": True}), TIMEOUT_S)
    assert await tokens(engine, prompt) == expected
    assert engine.num_loop_restarts == 1
    assert_idle(engine)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_a_dead_loop_thread_is_visible_and_ends_its_streams(engine, monkeypatch) -> None:
    def step():
        raise SystemExit  # not an Exception: the thread ends instead of restarting

    monkeypatch.setattr(engine._engine, "step", step)
    with pytest.raises(EngineClosed):
        await asyncio.wait_for(tokens(engine, random_prompt(7)), TIMEOUT_S)
    engine._thread.join(TIMEOUT_S)
    assert not engine.is_alive()
    with pytest.raises(EngineClosed):
        await tokens(engine, random_prompt(7))


async def test_seconds_since_progress_shows_a_stalled_loop(engine) -> None:
    assert engine.seconds_since_progress() == 0.0 and engine.is_alive()
    release = threading.Event()

    def blocking(view) -> int:  # a controller that blocks the engine thread: a stall
        release.wait(TIMEOUT_S)
        return 3

    stream = engine.generate(random_prompt(9), SamplingParams(max_new_tokens=8), blocking)
    pending = asyncio.create_task(drain(stream))
    deadline = time.monotonic() + TIMEOUT_S
    while engine.seconds_since_progress() < 0.3 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert engine.seconds_since_progress() >= 0.3 and engine.is_alive()
    release.set()
    assert len(await asyncio.wait_for(pending, TIMEOUT_S)) == 8
    while engine.seconds_since_progress() > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert engine.seconds_since_progress() == 0.0
