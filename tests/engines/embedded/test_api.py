"""AsyncEngine: streaming, controller callback contract, joins/leaves, errors, close."""

from __future__ import annotations

import asyncio
import json

import pytest

from engines.embedded import AsyncEngine, EngineClosed, RequestView, SamplingParams, TokenEvent
from tests.engines.embedded.conftest import BLOCK_SIZE, random_prompt


@pytest.fixture
async def engine(agreeing_pair):
    engine = AsyncEngine.load(
        agreeing_pair[0], agreeing_pair[1], device="cpu", max_batch_size=4, max_seq_len=128
    )
    yield engine
    await engine.close()


async def collect(
    engine: AsyncEngine, prompt, params, controller, context=None
) -> list[TokenEvent]:
    return [e async for e in engine.generate(prompt, params, controller, context)]


async def test_stream_reports_every_step(engine) -> None:
    views: list[RequestView] = []
    histories: list[list[int]] = []

    def controller(view: RequestView) -> int:
        views.append(view)
        histories.append(list(view.accept_lengths))  # the view's list is live: copy to keep
        return 5

    events = await collect(
        engine, random_prompt(1), SamplingParams(max_new_tokens=24), controller, {"task": "math"}
    )
    assert events[0].report is None and len(events[0].token_ids) == 1
    assert events[-1].finished and events[-1].finish_reason == "length"
    assert not any(e.finished for e in events[:-1])
    assert sum(len(e.token_ids) for e in events) == 24
    reports = [e.report for e in events[1:]]
    assert all(
        r is not None and r.spec_tokens <= 5 and len(r.accepted) == r.spec_tokens for r in reports
    )
    assert all(r.accept_length == sum(r.accepted) + 1 and r.step_time_s > 0 for r in reports)
    assert views[0].context == {"task": "math"} and views[0].step_index == 0
    assert histories[-1] == [r.accept_length for r in reports[:-1]]
    assert views[-1].num_generated == sum(len(e.token_ids) for e in events[:-1])
    assert all(v.num_remaining == 24 - v.num_generated for v in views)  # the planner's room
    assert engine.block_size == BLOCK_SIZE and engine.device == "cpu"
    assert engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )


async def test_failing_controller_degrades_to_k0(engine, caplog) -> None:
    def broken(view: RequestView) -> int:
        raise RuntimeError("policy bug")

    events = await collect(engine, random_prompt(2), SamplingParams(max_new_tokens=6), broken)
    assert [e.report.spec_tokens for e in events[1:]] == [0] * 5
    assert "spec controller failed" in caplog.text


async def test_concurrent_requests_share_batches(engine) -> None:
    async def one(i: int) -> list[TokenEvent]:
        return await collect(
            engine,
            random_prompt(10 + i),
            SamplingParams(max_new_tokens=10 + i),
            lambda view: view.step_index % BLOCK_SIZE,
        )

    results = await asyncio.gather(*(one(i) for i in range(7)))
    for i, events in enumerate(results):
        assert sum(len(e.token_ids) for e in events) == 10 + i
    sizes = {e.report.batch_size for events in results for e in events if e.report}
    assert max(sizes) == 4 and min(sizes) < 4  # queueing beyond max_batch_size, then leaving


async def test_too_long_prompt_is_rejected_with_a_clear_error(engine) -> None:
    with pytest.raises(ValueError, match="max_seq_len=128"):
        await collect(engine, [1] * 120, SamplingParams(max_new_tokens=20), lambda v: 0)


async def test_abandoned_stream_frees_its_slot(engine) -> None:
    stream = engine.generate(random_prompt(5), SamplingParams(max_new_tokens=100), lambda v: 1)
    await anext(stream)
    await stream.aclose()
    events = await collect(engine, random_prompt(6), SamplingParams(max_new_tokens=4), lambda v: 1)
    assert events[-1].finished


async def test_generate_after_close_raises(agreeing_pair) -> None:
    engine = AsyncEngine.load(
        agreeing_pair[0], agreeing_pair[1], device="cpu", plain_burst=8, spec_burst=3
    )
    assert engine._engine.plain_burst == engine._engine.spec_burst == 1  # bursts: CUDA only
    await engine.close()
    with pytest.raises(EngineClosed):
        await collect(engine, [1, 2], SamplingParams(max_new_tokens=2), lambda v: 0)


def test_cli_generate_json(agreeing_pair, tmp_path, capsys) -> None:
    from controller.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "hello"}) + "\n" + json.dumps({"prompt_ids": random_prompt(4)}) + "\n"
    )
    code = main(
        [
            "generate",
            "--target",
            str(agreeing_pair[0]),
            "--draft",
            str(agreeing_pair[1]),
            "--jsonl",
            str(prompts),
            "--spec-tokens",
            "4",
            "--max-new-tokens",
            "12",
            "--device",
            "cpu",
            "--json",
        ]
    )
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2
    for result in lines:
        assert set(result) >= {"text", "token_ids", "accept_lengths", "mean_accept_length"}
        assert 1 <= len(result["token_ids"]) <= 12
        assert max(result["accept_lengths"]) <= 5
        mean = sum(result["accept_lengths"]) / len(result["accept_lengths"])
        assert result["mean_accept_length"] == pytest.approx(mean)


def test_cli_generate_rejects_bad_spec_tokens(agreeing_pair, caplog) -> None:
    from controller.cli import main

    code = main(
        [
            "generate",
            "--target",
            str(agreeing_pair[0]),
            "--draft",
            str(agreeing_pair[1]),
            "--prompt",
            "x",
            "--spec-tokens",
            "8",
            "--device",
            "cpu",
        ]
    )
    assert code == 2
    assert "--spec-tokens 8: must be in 0..7" in caplog.text


def test_cli_generate_rejects_a_compile_scope_without_compile(agreeing_pair, caplog) -> None:
    from controller.cli import main

    args = ["generate", "--target", str(agreeing_pair[0]), "--draft", str(agreeing_pair[1])]
    code = main([*args, "--prompt", "x", "--device", "cpu", "--compile-scope", "layer"])
    assert code == 2
    assert "--compile-scope layer only applies with --compile" in caplog.text


def test_cli_generate_points_the_compile_caches_at_its_folder(
    agreeing_pair, tmp_path, caplog, monkeypatch
) -> None:
    """--compile-cache-dir: set before the engine loads (on the CPU the compile itself is then
    refused: it needs CUDA graphs)."""
    import os

    from controller.cli import main

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    folder = tmp_path / "compile-cache"
    args = ["generate", "--target", str(agreeing_pair[0]), "--draft", str(agreeing_pair[1])]
    args += ["--prompt", "x", "--device", "cpu", "--compile", "--compile-scope", "layer"]
    assert main([*args, "--compile-cache-dir", str(folder)]) == 2
    assert "torch_compile needs CUDA graphs" in caplog.text
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder.resolve())
    assert (folder / "triton").is_dir()


async def _stream_each(engine: AsyncEngine, prompts, ks) -> list[list[TokenEvent]]:
    """Every prompt streamed at once at its fixed k (30 tokens): each stream ends with its one
    finished event."""
    streams = [
        collect(engine, p, SamplingParams(max_new_tokens=30), lambda v, k=k: k)
        for p, k in zip(prompts, ks, strict=True)
    ]
    results = await asyncio.gather(*streams)
    for events in results:
        assert events[-1].finished and not any(e.finished for e in events[:-1])
    return results


async def _close_early(engine: AsyncEngine, prompt, tokens: int) -> None:
    """A stream closed after ``tokens`` events; returns once the engine has nothing left."""
    early = engine.generate(prompt, SamplingParams(max_new_tokens=60), lambda v: 0)
    for _ in range(tokens):
        await anext(early)
    await early.aclose()
    for _ in range(200):
        if not engine._engine.has_work:
            break
        await asyncio.sleep(0.01)
    assert not engine._engine.has_work


async def test_bursts_stream_every_step_and_abort_mid_stream(agreeing_pair) -> None:
    """An AsyncEngine whose engine runs plain and drafting bursts (several steps per loop
    turn): concurrent streams get the tokens of an engine stepping once per turn, one event
    per step in order (each with its report), the last one finished; a stream closed early
    leaves the engine idle."""
    prompts = [random_prompt(60 + i) for i in range(3)]
    ks = [0, 5, 0]
    runs = []
    for burst in (1, 4):
        engine = AsyncEngine.load(
            agreeing_pair[0], agreeing_pair[1], device="cpu", max_batch_size=4, max_seq_len=128
        )
        engine._engine.plain_burst = engine._engine.spec_burst = burst
        runner, calls = engine._engine.runner, {"plain": 0, "spec": 0}
        for kind in ("plain", "spec"):
            real = getattr(runner, f"{kind}_steps")

            def counted(*args, kind=kind, real=real, calls=calls, **kwargs):  # type: ignore[no-untyped-def]
                calls[kind] += 1
                return real(*args, **kwargs)

            setattr(runner, f"{kind}_steps", counted)
        try:
            results = await _stream_each(engine, prompts, ks)
            for events in results:
                assert all(e.report is not None for e in events[1:])
                plain = [e for e in events[1:] if e.report and e.report.spec_tokens == 0]
                assert all(len(e.token_ids) == 1 for e in plain)
            runs.append([[t for e in events for t in e.token_ids] for events in results])
            await _close_early(engine, prompts[0], 6)
            assert (calls["plain"] > 0 and calls["spec"] > 0) == (burst > 1), calls
            counts = engine.step_counts()  # steps, host round trips
            for kind in ("plain", "drafting"):
                steps, trips = counts[kind]
                assert steps > 0 and (steps > trips) == (burst > 1), counts
        finally:
            await engine.close()
    assert runs[0] == runs[1]


async def test_a_steps_events_reach_the_loop_in_one_hand_over(engine, monkeypatch) -> None:
    """Every stream of one event loop gets a step's events through one
    ``call_soon_threadsafe`` (each wakes the loop through its self-pipe): fewer hand-overs
    than events, and every stream still gets all its tokens in order."""
    loop = asyncio.get_running_loop()
    real = loop.call_soon_threadsafe
    calls = {"n": 0}

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    prompts = [random_prompt(80 + i) for i in range(4)]
    streams = [collect(engine, p, SamplingParams(max_new_tokens=12), lambda v: 0) for p in prompts]
    results = await asyncio.gather(*streams)
    events = sum(len(r) for r in results)
    assert all(sum(len(e.token_ids) for e in r) == 12 and r[-1].finished for r in results)
    assert calls["n"] < events / 2, (calls, events)


def test_a_stream_whose_event_loop_closed_is_aborted(agreeing_pair) -> None:
    """A consumer's event loop closed with its stream still open: the engine's next hand-over
    to it fails, and the request is aborted instead of decoding for nobody."""
    import time

    engine = AsyncEngine.load(agreeing_pair[0], agreeing_pair[1], device="cpu", max_seq_len=600)
    added = []
    add = engine._engine.add

    def recorded(request):  # type: ignore[no-untyped-def]
        added.append(request)
        add(request)

    engine._engine.add = recorded  # type: ignore[method-assign]
    loop = asyncio.new_event_loop()

    async def start():  # type: ignore[no-untyped-def]
        stream = engine.generate(random_prompt(90), SamplingParams(max_new_tokens=500), lambda v: 0)
        await anext(stream)
        return stream

    stream = loop.run_until_complete(start())
    loop.close()
    deadline = time.monotonic() + 20
    while engine._engine.has_work and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine._engine.has_work and stream is not None
    (request,) = added
    assert request.finish_reason is None and len(request.output_ids) < 500  # aborted
    asyncio.run(engine.close())


async def test_chained_bursts_stream_the_tokens_of_single_steps(agreeing_pair) -> None:
    """An AsyncEngine whose engine chains plain bursts (``plain_chain``): concurrent streams,
    one drafting, get the tokens of single steps, each ending with one finished event; a
    stream closed while a burst is queued leaves the engine idle with nothing queued."""
    prompts = [random_prompt(70 + i) for i in range(3)]
    ks = [0, 5, 0]
    runs = []
    for burst, chain in ((1, False), (4, True)):
        engine = AsyncEngine.load(
            agreeing_pair[0], agreeing_pair[1], device="cpu", max_batch_size=4, max_seq_len=128
        )
        engine._engine.plain_burst, engine._engine.plain_chain = burst, chain
        runner, chained = engine._engine.runner, [0]
        queue = runner.plain_queue

        def counted(*args, queue=queue, chained=chained, **kwargs):  # type: ignore[no-untyped-def]
            chained[0] += kwargs.get("after") is not None
            return queue(*args, **kwargs)

        runner.plain_queue = counted
        try:
            results = await _stream_each(engine, prompts, ks)
            runs.append([[t for e in events for t in e.token_ids] for events in results])
            await _close_early(engine, prompts[0], 10)
            assert engine._engine._chain is None
            assert (chained[0] > 0) == chain, chained
        finally:
            await engine.close()
    assert runs[0] == runs[1]
