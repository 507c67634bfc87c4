"""``Engine(plain_burst=n)``: a step where every row has k = 0 runs up to n plain steps queued
back to back (``ModelRunner.plain_steps``), each step's input token the previous step's on the
device. Same tokens as single steps, the same events and reports step by step, the draft's
context intact for the steps that draft afterwards."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from engines.embedded.engine import PLAIN_BURST, SPEC_BURST, Engine
from engines.embedded.events import (
    RequestView,
    SamplingParams,
    SpecController,
    StepReport,
    TokenEvent,
)
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from engines.embedded.runner import DEFERRED_POSITIONS, ModelRunner
from tests.engines.embedded.conftest import BIAS_TOKEN, BLOCK_SIZE, fixed_k, random_prompt
from tests.engines.embedded.test_lossless import PROMPT_LEN, run_staggered


def _engine(
    pair: tuple[Path, Path],
    burst: int,
    graphs: bool = False,
    defer: bool = False,
    planner: Any = None,
    max_batch_size: int = 4,
    burst_graph: int = 0,
    chain: bool = False,
) -> Engine:
    runner = load_runner(
        *pair,
        torch.device("cpu"),
        max_batch_size,
        128,
        use_cuda_graphs=graphs,
        defer_context=defer,
        plain_burst_graph=burst_graph,
    )
    return Engine(
        runner, max_batch_size, 128, planner=planner, plain_burst=burst, plain_chain=chain
    )


def _counted_bursts(engine: Engine) -> list[int]:
    """Each ``plain_steps`` call's step count, recorded as the engine calls it."""
    sizes: list[int] = []
    plain_steps = engine.runner.plain_steps

    def counted(rows, uniforms, overlap=None):  # type: ignore[no-untyped-def]
        sizes.append(int(uniforms.shape[0]))
        return plain_steps(rows, uniforms, overlap=overlap)

    engine.runner.plain_steps = counted  # type: ignore[method-assign]
    return sizes


def _requests(sampled: bool) -> list[Request]:
    """Greedy rows switching between plain stretches and drafting (lossless whatever k), a
    greedy row that stops on a token it meets mid-burst, and (``sampled``) seeded sampled rows
    that stay plain: their tokens depend only on the uniforms, one draw per step."""
    requests = []
    for i in range(6):
        is_sampled = sampled and i % 3 == 2
        controller: SpecController = (
            fixed_k(0)
            if is_sampled
            else (lambda view, i=i: 3 if (view.num_generated // 7 + i) % 3 == 0 else 0)
        )
        requests.append(
            Request(
                f"r{i}",
                random_prompt(70 + i, PROMPT_LEN),
                SamplingParams(
                    max_new_tokens=25 + 7 * i,
                    temperature=0.9 if is_sampled else 0.0,
                    top_p=0.95,
                    seed=300 + i,
                    stop_token_ids=(BIAS_TOKEN,) if i == 4 else (),
                ),
                controller,
                {},
            )
        )
    return requests


@pytest.mark.parametrize(
    ("graphs", "defer", "sampled"),
    [(False, False, False), (True, True, False), (True, True, True), (False, True, True)],
)
def test_bursts_give_the_tokens_of_single_steps(
    agreeing_pair: tuple[Path, Path], graphs: bool, defer: bool, sampled: bool
) -> None:
    """Two engines on the same requests (joining one per step, leaving at their lengths or a
    stop token), one stepping once per call and one in bursts of 5: the same tokens and
    finish reasons; bursts ran, some cut short by the longest remaining row."""
    outputs = []
    for burst in (1, 5):
        engine = _engine(agreeing_pair, burst, graphs=graphs, defer=defer)
        sizes = _counted_bursts(engine)
        requests = _requests(sampled)
        run_staggered(engine, requests)
        outputs.append([(r.output_ids, r.finish_reason) for r in requests])
        if burst == 1:
            assert sizes == []
        else:
            assert sizes.count(5) >= 5, sizes
    assert outputs[0] == outputs[1]
    assert any(reason == "stop" for _, reason in outputs[0])


def test_a_plain_burst_graph_gives_the_tokens_of_single_steps(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """``plain_burst_graph``: a burst of exactly that many greedy plain steps runs one static
    call holding all of them (a CUDA graph on a GPU; here the same fixed-shape function,
    eagerly): the tokens and finish reasons of single steps, with rows joining and leaving
    (padded batches of 3 rows in a graph of 4) and drafting stretches between the bursts
    (each row's stash inserted before it drafts); shorter bursts and a batch with a sampled
    row take the per-step path; ``burst_graphs`` off takes it too."""
    outputs = []
    replays: list[int] = []
    for burst, graph in ((1, 0), (5, 5), (5, 0)):
        engine = _engine(agreeing_pair, burst, graphs=True, defer=True, burst_graph=graph)
        runner = engine.runner
        held = [key for key in runner._graphs if key[0] == "stash_burst"]
        assert held == (
            [("stash_burst", b, 5) for b in reversed(runner.batch_sizes)] if graph else []
        )
        assert ("plain_burst_graph" in runner.kernel_settings()) == bool(graph)
        counted = [0]
        for key in held:
            call = runner._graphs[key]
            fn = call.fn

            def counting(
                *inputs: torch.Tensor, fn: Any = fn, counted: list[int] = counted
            ) -> torch.Tensor:
                counted[0] += 1
                return fn(*inputs)

            call.fn = counting
        requests = _requests(False)
        run_staggered(engine, requests)
        outputs.append([(r.output_ids, r.finish_reason) for r in requests])
        replays.append(counted[0])
    assert outputs[0] == outputs[1] == outputs[2]
    assert replays[0] == replays[2] == 0 and replays[1] >= 5, replays

    engine = _engine(agreeing_pair, 5, graphs=True, defer=True, burst_graph=5)
    engine.runner.burst_graphs = False
    assert engine.runner._burst_graph(3, 5) is None
    engine.runner.burst_graphs = True
    assert engine.runner._burst_graph(3, 5) is engine.runner._graphs["stash_burst", 4, 5]
    assert engine.runner._burst_graph(3, 4) is None
    with pytest.raises(ValueError, match="plain_burst_graph"):
        load_runner(
            *agreeing_pair,
            torch.device("cpu"),
            2,
            128,
            use_cuda_graphs=True,
            defer_context=True,
            plain_burst_graph=DEFERRED_POSITIONS + 1,
        )
    no_defer = load_runner(
        *agreeing_pair, torch.device("cpu"), 2, 128, use_cuda_graphs=True, plain_burst_graph=5
    )
    assert no_defer.plain_burst_graph == 0  # (the stash it writes needs defer_context)


@pytest.mark.parametrize(("defer", "burst_graph"), [(False, 0), (True, 0), (True, 5)])
def test_the_draft_context_after_bursts_is_a_fresh_prefill(
    agreeing_pair: tuple[Path, Path], defer: bool, burst_graph: int
) -> None:
    """After 2 * DEFERRED_POSITIONS + 3 tokens decoded in bursts (stashes filled and
    inserted on the way when deferring; ``burst_graph``: in the static calls of whole bursts),
    the draft's cache holds what a fresh prefill of the prompt and those tokens writes; then
    drafting accepts long runs again."""
    engine = _engine(
        agreeing_pair,
        5,
        graphs=bool(burst_graph),
        defer=defer,
        max_batch_size=1,
        burst_graph=burst_graph,
    )
    plain_for = 2 * DEFERRED_POSITIONS + 3
    request = plain_then_drafting(plain_for)
    engine.add(request)
    while len(request.output_ids) < plain_for:
        engine.step()
    assert_fresh_draft_context(agreeing_pair, engine, request)


def plain_then_drafting(plain_for: int) -> Request:
    """A request that decodes ``plain_for`` tokens at k = 0, then drafts whole blocks."""
    return Request(
        "r",
        random_prompt(90, PROMPT_LEN),
        SamplingParams(max_new_tokens=plain_for + 40),
        lambda view: 0 if view.num_generated < plain_for else BLOCK_SIZE - 1,
        {},
    )


def assert_fresh_draft_context(pair: tuple[Path, Path], engine: Engine, request: Request) -> None:
    """The single row's draft cache (its stash inserted) holds what a fresh prefill of the
    prompt and its tokens writes; the rest of the request then drafts and accepts long runs."""
    runner = engine.runner
    runner._insert_deferred([request], False)
    position = request.position
    after = (
        runner.draft_cache.k[:, 0, :, :position].clone(),
        runner.draft_cache.v[:, 0, :, :position].clone(),
    )
    fresh = _engine(pair, 1, max_batch_size=1)
    probe = Request(
        "p", request.prompt_ids + request.output_ids[:-1], SamplingParams(1), fixed_k(0), {}
    )
    probe.slot = 0
    fresh.runner.prefill(probe, torch.zeros(2 * BLOCK_SIZE + 1))
    reference = fresh.runner.draft_cache
    torch.testing.assert_close(after[0], reference.k[:, 0, :, :position], atol=1e-5, rtol=0)
    torch.testing.assert_close(after[1], reference.v[:, 0, :, :position], atol=1e-5, rtol=0)
    while engine.has_work:
        engine.step()
    drafted = [a for a, k in zip(request.accept_lengths, request.spec_tokens, strict=True) if k]
    assert drafted and sum(drafted) / len(drafted) > 2.0, drafted


class RecordingPlanner:
    """A step planner that keeps every row plain and records what each step told it."""

    def __init__(self) -> None:
        self.steps: list[list[StepReport]] = []
        self.plans = 0

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        self.plans += 1
        return [0] * len(views)

    def record(self, controllers: Sequence[SpecController], reports: Sequence[StepReport]) -> None:
        self.steps.append(list(reports))

    def prepare(self, views: Sequence[RequestView], controllers: Sequence[SpecController]) -> None:
        pass


def test_a_burst_reports_step_by_step(agreeing_pair: tuple[Path, Path]) -> None:
    """One ``step()`` of a 4-step burst: each row's events in step order, one token each; a
    row that stops mid-burst has none after its finishing one; the planner planned once and
    is told each step apart (batch size, k = 0, accept length 1, a quarter of the time)."""
    planner = RecordingPlanner()
    engine = _engine(agreeing_pair, 4, planner=planner)
    prompts = [random_prompt(95 + i, PROMPT_LEN) for i in range(3)]
    requests = [
        Request(f"r{i}", p, SamplingParams(max_new_tokens=30), fixed_k(0), {})
        for i, p in enumerate(prompts)
    ]
    single = _engine(agreeing_pair, 1)
    reference = [Request(r.request_id, r.prompt_ids, r.params, fixed_k(0), {}) for r in requests]
    for engine_, batch in ((engine, requests), (single, reference)):
        for request in batch:
            engine_.add(request)
        engine_.step()  # the prefills, then the first burst
    while single.has_work:
        single.step()
    # The second row stops on the token its single-step run makes third in the next burst
    # (or earlier, where that token comes sooner).
    done = len(requests[1].output_ids)
    stop = reference[1].output_ids[done + 2]
    cut = reference[1].output_ids[done : done + 4].index(stop) + 1
    requests[1].params = SamplingParams(max_new_tokens=30, stop_token_ids=(stop,))
    before = [len(r.output_ids) for r in requests]
    engine._tell_planner()  # the first burst's steps
    planner.steps.clear()
    plans = planner.plans
    events = engine.step()
    assert planner.plans == plans + 1
    by_row: dict[str, list[TokenEvent]] = {}
    for request, event in events:
        assert isinstance(event, TokenEvent)
        by_row.setdefault(request.request_id, []).append(event)
    assert [len(by_row[r.request_id]) for r in requests] == [4, cut, 4]
    assert by_row["r1"][-1].finished and by_row["r1"][-1].finish_reason == "stop"
    assert not any(e.finished for e in by_row["r1"][:-1] + by_row["r0"] + by_row["r2"])
    for request, start in zip(requests, before, strict=True):
        got = [t for e in by_row[request.request_id] for t in e.token_ids]
        assert got == request.output_ids[start:]
        assert [len(e.token_ids) for e in by_row[request.request_id]] == [1] * len(got)
    engine._tell_planner()
    assert [len(step) for step in planner.steps] == [3] * cut + [2] * (4 - cut)
    times = {report.step_time_s for step in planner.steps for report in step}
    assert len(times) == 1 and times.pop() > 0
    for step in planner.steps:
        assert all(r.spec_tokens == 0 and r.accept_length == 1 for r in step)
        assert {r.batch_size for r in step} == {3}
    assert not engine.scheduler.running or requests[1] not in engine.scheduler.running


def test_when_a_step_bursts(agreeing_pair: tuple[Path, Path]) -> None:
    """Bursts only when every row is plain, no longer than the longest remaining row; the
    engine's default is one step per call off CUDA; a burst that raises falls back to one
    ordinary step; bad settings are refused."""
    assert _engine(agreeing_pair, 1).plain_burst == 1
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 2, 128)
    assert Engine(runner, 2, 128).plain_burst == 1
    for bad in (0, DEFERRED_POSITIONS + 1):
        with pytest.raises(ValueError, match="plain_burst"):
            Engine(runner, 2, 128, plain_burst=bad)

    engine = _engine(agreeing_pair, 6)
    sizes = _counted_bursts(engine)
    drafting = Request("d", random_prompt(1, PROMPT_LEN), SamplingParams(50), fixed_k(2), {})
    plain = Request("p", random_prompt(2, PROMPT_LEN), SamplingParams(3), fixed_k(0), {})
    engine.add(drafting)
    engine.add(plain)
    engine.step()
    assert sizes == []  # a drafting row: one step
    drafting.controller = fixed_k(0)
    engine.step()
    assert sizes == [6]
    short = _engine(agreeing_pair, 6)
    short_sizes = _counted_bursts(short)
    short.add(Request("s", random_prompt(3, PROMPT_LEN), SamplingParams(3), fixed_k(0), {}))
    while short.has_work:
        short.step()
    assert short_sizes == [2]  # the prefill's token, then the 2 the row still needs

    failing = _engine(agreeing_pair, 4)

    def broken(*args: object, **kwargs: object) -> list[Any]:
        raise RuntimeError("device fault")

    failing.runner.plain_steps = broken  # type: ignore[method-assign]
    request = Request("f", random_prompt(4, PROMPT_LEN), SamplingParams(10), fixed_k(0), {})
    failing.add(request)
    failing.step()
    events = failing.step()
    assert [len(e.token_ids) for _, e in events if isinstance(e, TokenEvent)] == [1]
    while failing.has_work:
        failing.step()
    assert request.finish_reason == "length" and len(request.output_ids) == 10


def test_plain_steps_refuses_what_it_cannot_run(agreeing_pair: tuple[Path, Path]) -> None:
    runner: ModelRunner = load_runner(*agreeing_pair, torch.device("cpu"), 2, 128)
    row = Request("r", random_prompt(5, PROMPT_LEN), SamplingParams(5), fixed_k(0), {})
    row.slot = 0
    uniforms = torch.zeros(2 * BLOCK_SIZE + 1)
    runner.prefill(row, uniforms)
    row.append([1])
    for shape in [(2, 2 * BLOCK_SIZE + 1), (0, 1, 2 * BLOCK_SIZE + 1), (3, 2, 17)]:
        with pytest.raises(ValueError, match="steps"):
            runner.plain_steps([row], torch.zeros(shape))
    with pytest.raises(ValueError, match="steps"):
        runner.plain_steps([row], torch.zeros(DEFERRED_POSITIONS + 1, 1, 2 * BLOCK_SIZE + 1))
    runner.plain_fast_path = False
    with pytest.raises(ValueError, match="plain fast path"):
        runner.plain_steps([row], torch.zeros(2, 1, 2 * BLOCK_SIZE + 1))


def _synthetic_requests(
    prompt_seed: int, new_tokens: list[int], sampled: int, ks: list[Callable[..., int]]
) -> list[Request]:
    """Rows of alternating tasks under synthetic acceptance (their draws keyed ``k<i>``), one
    of them (``sampled``) seeded and sampled at temperature 0.8, the rest greedy."""
    return [
        Request(
            f"s{i}",
            random_prompt(prompt_seed + i, PROMPT_LEN),
            SamplingParams(max_new_tokens=n, temperature=0.8 if i == sampled else 0.0, seed=i),
            k,
            {"task": ("math", "chat")[i % 2], "synthetic_key": f"k{i}"},
        )
        for i, (n, k) in enumerate(zip(new_tokens, ks, strict=True))
    ]


def test_synthetic_acceptance_takes_the_plain_path_and_bursts(tiny_pair: tuple[Path, Path]) -> None:
    """Synthetic acceptance (the benchmark harness's engines) draws nothing for a k = 0 step:
    its plain steps take the plain path and its bursts as the real engine's do. Rows alternate
    8 plain steps and 8 drafting steps (by step index: the same k whether asked every step
    or every burst); the general path, the plain path one step a call and bursts of 4 give
    the same tokens and accept lengths, the drafting steps' drawn runs included."""
    from tests.engines.embedded.test_synthetic import tiny_profiles

    runs = []
    for fast, burst in ((False, 1), (True, 1), (True, 4)):
        runner = load_runner(
            *tiny_pair, torch.device("cpu"), 4, 128, synthetic=tiny_profiles(seed=3)
        )
        runner.plain_fast_path = fast
        engine = Engine(runner, 4, 128, plain_burst=burst)
        sizes = _counted_bursts(engine)
        requests = _synthetic_requests(
            120, [60] * 3, 2, [lambda view: 0 if (view.step_index // 8) % 2 == 0 else 3] * 3
        )
        for request in requests:
            engine.add(request)
        while engine.has_work:
            engine.step()
        runs.append([(r.output_ids, r.accept_lengths, r.spec_tokens) for r in requests])
        assert (sizes.count(4) >= 4) == (burst == 4), sizes
        assert any(a > 1 for r in requests for a in r.accept_lengths)
    assert runs[0] == runs[1] == runs[2]


# -- drafting bursts (Engine(spec_burst=n), ModelRunner.spec_steps) -------------------------


def _spec_requests(sampled: bool) -> list[Request]:
    """Rows at their own constant k (so a burst's k is the k of each of its steps), joining
    and leaving at their lengths, one stopping on a token it meets, seeded sampled rows."""
    ks = [3, BLOCK_SIZE - 1, 1, 5, 0, 2]
    return [
        Request(
            f"d{i}",
            random_prompt(140 + i, PROMPT_LEN),
            SamplingParams(
                max_new_tokens=20 + 9 * i,
                temperature=0.9 if sampled and i % 2 else 0.0,
                top_p=0.95,
                seed=400 + i,
                stop_token_ids=(BIAS_TOKEN,) if i == 3 else (),
            ),
            fixed_k(k),
            {},
        )
        for i, k in enumerate(ks)
    ]


def _spec_engine(pair: tuple[Path, Path], burst: int, graphs: bool, defer: bool) -> Engine:
    runner = load_runner(
        *pair, torch.device("cpu"), 4, 160, use_cuda_graphs=graphs, defer_context=defer
    )
    return Engine(runner, 4, 160, plain_burst=burst, spec_burst=burst)


def _counted_spec_bursts(engine: Engine) -> list[int]:
    sizes: list[int] = []
    spec_steps = engine.runner.spec_steps

    def counted(rows, spec_tokens, uniforms, overlap=None):  # type: ignore[no-untyped-def]
        sizes.append(int(uniforms.shape[0]))
        return spec_steps(rows, spec_tokens, uniforms, overlap=overlap)

    engine.runner.spec_steps = counted  # type: ignore[method-assign]
    return sizes


def _replayed(done: list[Request]) -> list[Request]:
    """The same requests afresh, each row's k at each step replayed from a finished run
    (``spec_tokens``: what its steps verified, a burst's cuts included)."""

    def replay(ks: list[int]) -> Callable[[Any], int]:
        return lambda view: ks[view.step_index]

    return [
        Request(r.request_id, list(r.prompt_ids), r.params, replay(list(r.spec_tokens)), {})
        for r in done
    ]


@pytest.mark.parametrize(
    ("graphs", "defer", "sampled"),
    [(False, False, False), (True, True, False), (True, False, True), (False, True, True)],
)
def test_drafting_bursts_give_the_tokens_and_accept_lengths_of_single_steps(
    agreeing_pair: tuple[Path, Path],
    graphs: bool,
    defer: bool,
    sampled: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests joining one per step through an engine in bursts of 3, then through one
    stepping once per call with each row's k replayed from the burst run: the same tokens,
    accept lengths and finish reasons (the accept lengths say each burst step's draft read the
    context a single step's would). Drafting bursts ran, and rows near their end drafted fewer
    tokens in some (the burst's cuts) while greedy rows still emit what single steps at the
    planned k emit (cuts up to half the step's drafted tokens allowed here, so that these few
    rows have some)."""
    monkeypatch.setattr(Engine, "burst_cut_share", 0.5)
    engine = _spec_engine(agreeing_pair, 3, graphs, defer)
    sizes = _counted_spec_bursts(engine)
    bursts = _spec_requests(sampled)
    run_staggered(engine, bursts)
    assert sizes.count(3) >= 3, sizes
    single = _spec_engine(agreeing_pair, 1, graphs, defer)
    single_sizes = _counted_spec_bursts(single)
    replayed = _replayed(bursts)
    run_staggered(single, replayed)
    assert single_sizes == []
    outputs = [
        [(r.output_ids, r.accept_lengths, r.finish_reason) for r in run]
        for run in (bursts, replayed)
    ]
    assert outputs[0] == outputs[1]
    assert [r.spec_tokens for r in bursts] == [r.spec_tokens for r in replayed]
    assert any(reason == "stop" for *_, reason in outputs[0])
    assert any(a > 2 for _, accepts, _ in outputs[0] for a in accepts)
    planned = _spec_engine(agreeing_pair, 1, graphs, defer)
    at_planned_k = _spec_requests(sampled)
    run_staggered(planned, at_planned_k)
    assert any(a.spec_tokens != b.spec_tokens for a, b in zip(at_planned_k, bursts, strict=True))
    for a, b in zip(at_planned_k, bursts, strict=True):
        if not a.params.temperature:  # greedy: lossless at any k
            assert a.output_ids == b.output_ids


def test_a_burst_cuts_rows_near_their_end_within_its_share() -> None:
    """The burst's length and k: the rows' room for k + 1 tokens a step decides it when
    that allows the whole burst; else rows near their end draft fewer (room // steps - 1) in
    the longest burst whose cuts stay within ``burst_cut_share`` of the drafted tokens; a
    lone row near its end steps singly at its own k."""
    from types import SimpleNamespace

    class Runner:
        def spec_steps(self) -> None: ...

    engine = Engine.__new__(Engine)
    engine.spec_burst, engine.plain_burst, engine.runner, engine.planner = 4, 1, Runner(), None

    def plan(remaining: list[int], ks: list[int]) -> tuple[int, list[int]]:
        rows = [SimpleNamespace(num_remaining=n) for n in remaining]
        return engine._burst_plan(rows, ks)  # type: ignore[arg-type]

    assert plan([400] * 8, [7] * 8) == (4, [7] * 8)
    assert plan([400] * 7 + [10], [7] * 8) == (4, [7] * 7 + [1])  # 6 of 56 drafted cut
    assert plan([400] * 3 + [10], [7] * 4) == (2, [7, 7, 7, 4])  # 3 of 28 cut, not 5 or 6
    assert plan([20], [15]) == (1, [15])  # a lone row: no cut
    assert plan([40], [7]) == (4, [7])  # its room: 40 // 8 = 5 steps
    assert plan([400, 3], [7, 7]) == (1, [7, 7])  # 3 steps would cut 7 of 14
    assert plan([400] * 7 + [3], [7] * 8) == (3, [7] * 7 + [0])  # room for 3 tokens: 3 steps
    assert plan([400] * 8, [0] * 8) == (1, [0] * 8)  # plain steps: plain_burst 1


def test_drafting_bursts_equal_target_only_greedy(agreeing_pair: tuple[Path, Path]) -> None:
    """Greedy rows at k = 5 in bursts of 4 emit exactly what one request at k = 0 does."""
    prompts = [random_prompt(160 + i, PROMPT_LEN) for i in range(3)]
    engine = _spec_engine(agreeing_pair, 4, True, True)
    sizes = _counted_spec_bursts(engine)
    reference = _spec_engine(agreeing_pair, 1, False, False)
    bursts = [
        Request(f"b{i}", p, SamplingParams(40), fixed_k(5), {}) for i, p in enumerate(prompts)
    ]
    plain = [Request(f"p{i}", p, SamplingParams(40), fixed_k(0), {}) for i, p in enumerate(prompts)]
    for engine_, batch in ((engine, bursts), (reference, plain)):
        for request in batch:
            engine_.add(request)
        while engine_.has_work:
            engine_.step()
    assert [r.output_ids for r in bursts] == [r.output_ids for r in plain]
    assert 4 in sizes


def test_when_a_drafting_step_bursts(agreeing_pair: tuple[Path, Path]) -> None:
    """Off by default off CUDA; with ``spec_burst`` a one-phase step bursts up to the rows'
    room (``num_remaining // (k + 1)``; a lone row's k is not cut), synthetic acceptance too; a
    planner's two-phase step does not; a failing burst falls back to one step; bad settings
    are refused."""
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 2, 128)
    assert Engine(runner, 2, 128).spec_burst == 1
    for bad in (0, DEFERRED_POSITIONS + 1):
        with pytest.raises(ValueError, match="spec_burst"):
            Engine(runner, 2, 128, spec_burst=bad)
    engine = Engine(runner, 2, 128, spec_burst=8)
    sizes = _counted_spec_bursts(engine)
    request = Request("r", random_prompt(7, PROMPT_LEN), SamplingParams(30), fixed_k(4), {})
    engine.add(request)
    engine.step()  # the prefill (1 token), then 29 // 5 = 5 steps of room
    assert sizes == [5]
    while engine.has_work:
        engine.step()
    assert len(request.output_ids) == 30

    class TwoPhase(RecordingPlanner):
        def plan(self, views, controllers):  # type: ignore[no-untyped-def]
            return [4] * len(views)

        def allocates(self) -> bool:
            return True

        def allocate(self, views, controllers, confidence):  # type: ignore[no-untyped-def]
            return [len(c) for c in confidence]

    two_phase = Engine(
        load_runner(*agreeing_pair, torch.device("cpu"), 2, 128), 2, 128, TwoPhase(), spec_burst=8
    )
    two_sizes = _counted_spec_bursts(two_phase)
    two_phase.add(Request("t", random_prompt(8, PROMPT_LEN), SamplingParams(30), fixed_k(4), {}))
    two_phase.step()
    assert two_sizes == []

    from tests.engines.embedded.test_synthetic import tiny_profiles

    synthetic = Engine(
        load_runner(*agreeing_pair, torch.device("cpu"), 2, 128, synthetic=tiny_profiles()),
        2,
        128,
        spec_burst=8,
    )
    synthetic_sizes = _counted_spec_bursts(synthetic)
    synthetic.add(
        Request("s", random_prompt(9, PROMPT_LEN), SamplingParams(30), fixed_k(4), {"task": "math"})
    )
    synthetic.step()
    assert synthetic_sizes == [5]

    failing = Engine(load_runner(*agreeing_pair, torch.device("cpu"), 2, 128), 2, 128, spec_burst=4)

    def broken(*args: object, **kwargs: object) -> list[Any]:
        raise RuntimeError("device fault")

    failing.runner.spec_steps = broken  # type: ignore[method-assign]
    row = Request("f", random_prompt(10, PROMPT_LEN), SamplingParams(25), fixed_k(3), {})
    failing.add(row)
    while failing.has_work:
        failing.step()
    assert row.finish_reason == "length" and len(row.output_ids) == 25
    assert len(row.accept_lengths) == len(row.spec_tokens)


def test_spec_steps_refuses_what_it_cannot_run(agreeing_pair: tuple[Path, Path]) -> None:
    runner: ModelRunner = load_runner(*agreeing_pair, torch.device("cpu"), 2, 128)
    row = Request("r", random_prompt(11, PROMPT_LEN), SamplingParams(5), fixed_k(0), {})
    row.slot = 0
    runner.prefill(row, torch.zeros(2 * BLOCK_SIZE + 1))
    row.append([1])
    for k, shape in (([3], (2, 2 * BLOCK_SIZE + 1)), ([3], (0, 1, 17)), ([3, 3], (2, 1, 17))):
        with pytest.raises(ValueError, match="steps"):
            runner.spec_steps([row], k, torch.zeros(shape))
    with pytest.raises(ValueError, match="some k > 0"):
        runner.spec_steps([row], [0], torch.zeros(2, 1, 2 * BLOCK_SIZE + 1))


@pytest.mark.parametrize("burst", [1, 3])
def test_a_plain_steps_rows_share_the_report_each_would_get(
    agreeing_pair: tuple[Path, Path], burst: int
) -> None:
    """Every row of a plain step (single or in a burst) is reported as k = 0, one token, no
    drafts, no confidence, one-phase, at the step's batch size and time: one report object
    for the step's rows."""
    planner = RecordingPlanner()
    engine = _engine(agreeing_pair, burst, planner=planner)
    for i in range(3):
        engine.add(
            Request(f"s{i}", random_prompt(170 + i, PROMPT_LEN), SamplingParams(12), fixed_k(0), {})
        )
    while engine.has_work:
        engine.step()
    engine._tell_planner()
    assert planner.steps
    for step in planner.steps:
        first = step[0]
        assert all(report is first for report in step)
        assert first == StepReport(0, 1, [], first.step_time_s, len(step), (), False)
        assert first.step_time_s > 0


@pytest.mark.parametrize("graphs", [False, True])
def test_synthetic_drafting_bursts_give_the_draws_of_single_steps(
    tiny_pair: tuple[Path, Path], graphs: bool
) -> None:
    """Synthetic acceptance (the GPU harness's engines) in drafting bursts of 4: each step of
    a burst accepts min(k, its drawn run) and emits the target's token there, as single steps
    do, so tokens, accept lengths and the drawn confidence each step reports are the same;
    a greedy and a seeded sampled row, a row finishing mid-burst."""
    from engines.embedded.synthetic import SyntheticAcceptance, TaskProfile

    profiles = SyntheticAcceptance(
        {
            "math": TaskProfile.from_accept_length(4.5, BLOCK_SIZE - 1, decay=0.9),
            "chat": TaskProfile.from_accept_length(2.5, BLOCK_SIZE - 1, decay=0.5),
        },
        seed=5,
        name="tiny-confident",
        confidence_auc=0.8,
    )
    runs = []
    for burst in (1, 4):
        runner = load_runner(
            *tiny_pair, torch.device("cpu"), 4, 160, use_cuda_graphs=graphs, synthetic=profiles
        )
        runner.measure_confidence = True
        engine = Engine(runner, 4, 160, spec_burst=burst)
        sizes = _counted_spec_bursts(engine)
        requests = _synthetic_requests(
            200, [37, 48, 59], 1, [fixed_k(k) for k in (3, BLOCK_SIZE - 1, 5)]
        )
        for request in requests:
            engine.add(request)
        confidence: dict[str, list[tuple[float, ...]]] = {r.request_id: [] for r in requests}
        while engine.has_work:
            for request, event in engine.step():
                report = getattr(event, "report", None)
                if report is not None:
                    confidence[request.request_id].append(report.draft_confidence)
        runs.append([(r.output_ids, r.accept_lengths, confidence[r.request_id]) for r in requests])
        assert (4 in sizes) == (burst == 4), sizes
    assert runs[0] == runs[1]
    assert any(a > 2 for _, accepts, _ in runs[0] for a in accepts)
    assert all(
        c and len(c[0]) == k for (_, _, c), k in zip(runs[0], (3, BLOCK_SIZE - 1, 5), strict=True)
    )


def test_bursts_and_chains_default_on_for_a_cuda_runner(agreeing_pair: tuple[Path, Path]) -> None:
    """A runner on a CUDA device gets ``PLAIN_BURST`` plain and ``SPEC_BURST`` drafting steps
    per round trip unless told otherwise (the engine reads only the runner's device type to
    choose: a CPU runner relabelled stands in for one here)."""
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 2, 128)
    runner.device = torch.device("cuda")
    engine = Engine(runner, 2, 128)
    assert (engine.plain_burst, engine.spec_burst) == (PLAIN_BURST, SPEC_BURST) == (4, 4)
    assert engine.plain_chain is True  # chained plain bursts: the CUDA default (session 46)
    single = Engine(runner, 2, 128, plain_burst=1, spec_burst=1, plain_chain=False)
    assert (single.plain_burst, single.spec_burst, single.plain_chain) == (1, 1, False)
    runner.device = torch.device("cpu")
    assert Engine(runner, 2, 128).plain_chain is False
