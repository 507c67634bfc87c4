"""The embedded engine's start-up step-cost profile (engines/embedded/step_profile.py): its
table, its cache by model and device, an engine that still decodes exactly afterwards, and the
running policy pricing steps with it only when it has no cost table of its own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams, TokenEvent
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from engines.embedded.step_profile import (
    batch_sizes_for,
    bucket_points,
    cache_key,
    cached_or_profiled,
    profile_engine,
    profile_steps,
    profile_token_buckets,
    widths_for,
)
from engines.step_controller import FixedPolicySource, StepController
from policies.baselines.ragged_cost import TableRaggedCost
from policies.baselines.slot_budget import draft_budget
from policies.costmodel import CostModel, CostTable
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec, PolicySpec
from policies.online import OnlineModels
from policies.types import Task
from tests.tinymodels import write_tiny_pair

MAX_BATCH = 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_pair(tmp_path_factory.mktemp("tiny"), block_size=16)


def engine_for(pair: tuple[Path, Path]) -> Engine:
    runner = load_runner(pair[0], pair[1], torch.device("cpu"), MAX_BATCH, 256)
    return Engine(runner, MAX_BATCH, 256)


def greedy(engine: Engine, k: int) -> list[list[int]]:
    requests = [
        Request(f"r{i}", [5 + i, 9, 40 + i], SamplingParams(max_new_tokens=20), lambda v: k, {})
        for i in range(3)
    ]
    for request in requests:
        engine.add(request)
    while engine.has_work:
        for _, event in engine.step():
            assert isinstance(event, TokenEvent)
    return [r.output_ids for r in requests]


def test_the_grid_covers_every_batch_and_the_widths_the_policy_can_choose() -> None:
    assert batch_sizes_for(8) == [1, 2, 4, 8]
    assert batch_sizes_for(6) == [1, 2, 4, 6]
    assert batch_sizes_for(1) == [1]
    assert widths_for(16) == [1, 8, 16]
    assert widths_for(8) == [1, 8]
    # rows at their own widths: k = 1 and every fourth width as well
    assert widths_for(16, per_row_widths=True) == [1, 2, 4, 8, 12, 16]
    assert widths_for(8, per_row_widths=True) == [1, 2, 4, 8]


def whole_step_s(batch: float, width: float) -> float:
    """A ragged engine's step in ms: the plain forward, the draft forward once any row drafts,
    then a price per verified token (about the H200 8B-shape profile at batch 1: 6.36 ms at
    width 1, 8.58 at 8, 8.70 at 16)."""
    drafting = 2.1 if width > 1 else 0.0
    return 6.36 + 0.1 * batch + drafting + 0.015 * batch * (width - 1)


def test_a_ragged_profile_prices_drafted_tokens_without_the_draft_forward() -> None:
    """vLLM's budget rule and the per-slot allocator read the marginal cost of one more
    drafted token from the table; on widths 1, 8, 16 the draft forward was spread over the
    first seven tokens of each row, and at batch 1 such a token looked 20x as expensive as it
    is (H200 session 15: vllm-av then verified about half the drafts)."""

    def profiled(widths: list[int]) -> TableRaggedCost:
        batches = (1, 8)
        times = tuple(tuple(whole_step_s(b, w) for w in widths) for b in batches)
        table = CostTable(batches, tuple(widths), times, includes_draft=True)
        return TableRaggedCost(CostModel(table, block_size=16))

    coarse, fine = profiled(widths_for(16)), profiled(widths_for(16, per_row_widths=True))
    for rows in (1, 4, 8):
        for drafts in (rows, 3 * rows, 7 * rows, 12 * rows):  # each row drafting 1 to 12
            truth = whole_step_s(rows, 1 + drafts / rows)
            assert fine.step_time_s(rows, drafts) == pytest.approx(truth, rel=1e-9)
            marginal = fine.step_time_s(rows, drafts + rows) - fine.step_time_s(rows, drafts)
            assert marginal == pytest.approx(0.015 * rows, rel=1e-6)
        assert fine.step_time_s(rows, 0) == pytest.approx(whole_step_s(rows, 1))
    old = coarse.step_time_s(1, 4) - coarse.step_time_s(1, 3)
    assert old > 15 * 0.015  # the old grid's price of one more drafted token at batch 1


def stair_step_s(batch: float, width: float) -> float:
    """A GPU's ragged step in s: 25 us a token, 1.8 ms more past 384 tokens (a matrix
    product's next tile) and 6 ms of draft once a row drafts (about the H200 8B shape at 64
    rows: 23.3 ms at 384 tokens, 25.2 at 416-448, session 22's harness timelines)."""
    tokens = batch * width
    stair = 1.8e-3 if tokens > 384 else 0.0
    return 0.0075 + 25e-6 * tokens + stair + (6e-3 if width > 1 else 0.0)


def stair_cost(buckets: bool) -> TableRaggedCost:
    """The stair priced by the per-row grid (widths 1, 2, 4, 8, 12, 16), with or without
    whole steps measured at the captured token counts of 64 rows (every 32 from 256 to 512,
    then every 64, as ``RaggedShapes`` captures them)."""
    widths = widths_for(16, per_row_widths=True)
    times = tuple(tuple(stair_step_s(b, w) for w in widths) for b in (32, 64))
    counts = [*range(256, 512, 32), *range(512, 1025, 64)]
    measured = ((64, tuple((n, stair_step_s(64, n / 64)) for n in counts)),)
    table = CostTable(
        (32, 64),
        tuple(widths),
        times,
        includes_draft=True,
        token_buckets=measured if buckets else (),
    )
    return TableRaggedCost(CostModel(table, block_size=16))


def test_token_buckets_show_the_budget_the_stair_a_line_between_widths_hides() -> None:
    """64 rows, each with 15 drafts of survival 0.85^j: priced on the widths' line (256 and
    512 tokens) the stair at 384 is a slope and the budget lands past it, where the step pays
    the next tile for a few drafts (5% fewer tokens a second); priced at the captured counts
    it stops at 384, the best the true step times allow."""

    def budget(cost: TableRaggedCost) -> int:
        survival = np.concatenate([0.85 ** np.arange(1, 16)] * 64)
        scores = np.sort(survival + np.linspace(0, 1e-6, survival.size))[::-1]
        costs = np.array([cost.step_time_s(64, d) for d in range(scores.size + 1)])
        return draft_budget(scores, 64, costs)

    assert 64 + budget(stair_cost(False)) == 448
    assert 64 + budget(stair_cost(True)) == 384


def test_a_step_is_priced_at_the_captured_count_it_runs() -> None:
    cost = stair_cost(True)
    # 64 rows: a step runs the smallest measured count >= its tokens, at its measured time
    assert cost.step_time_s(64, 320) == pytest.approx(stair_step_s(64, 6))
    assert cost.step_time_s(64, 321) == pytest.approx(stair_step_s(64, 416 / 64))
    assert cost.step_time_s(64, 350) == cost.step_time_s(64, 352)
    # fewer rows pad to the 64-row graph: the table's 48-row step at the count, scaled alike
    line = TableRaggedCost(CostModel(stair_cost(False)._model.table, block_size=16))
    ratio = stair_step_s(64, 416 / 64) / line.step_time_s(64, 416 - 64)
    assert cost.step_time_s(48, 400 - 48) == pytest.approx(line.step_time_s(48, 416 - 48) * ratio)
    # past the largest count, without drafts, or with no bucketed batch above: the line
    assert cost.step_time_s(64, 1100) == pytest.approx(line.step_time_s(64, 1100))
    assert cost.step_time_s(64, 0) == pytest.approx(line.step_time_s(64, 0))
    assert cost.step_time_s(80, 400) == pytest.approx(line.step_time_s(80, 400))


def test_token_buckets_round_trip_and_are_checked() -> None:
    table = stair_cost(True)._model.table
    again = CostTable.from_dict(table.to_dict())
    assert again.token_buckets == table.token_buckets
    assert "token_buckets" not in stair_cost(False)._model.table.to_dict()
    with pytest.raises(ValueError, match="must ascend"):
        CostTable(
            (1, 2), (1, 2), ((1.0, 2.0), (1.0, 2.0)), token_buckets=((2, ((8, 1.0), (4, 1.0))),)
        )
    with pytest.raises(ValueError, match="tokens >= the batch"):
        CostTable((1, 2), (1, 2), ((1.0, 2.0), (1.0, 2.0)), token_buckets=((8, ((4, 1.0),)),))


def test_a_cpu_engine_has_no_token_buckets_and_explicit_points_time_mixed_rows(
    pair: tuple[Path, Path],
) -> None:
    engine = engine_for(pair)
    before = greedy(engine_for(pair), 15)
    assert bucket_points(engine) == {}  # no ragged CUDA graphs
    table = profile_engine(engine, 2)
    assert table.token_buckets == ()
    seen: list[tuple[int, int]] = []
    measured = profile_token_buckets(
        engine, {2: [3, 5]}, timed_steps=1, on_point=lambda b, n, s: seen.append((b, n))
    )
    assert seen == [(2, 3), (2, 5)]  # rows at k 1 and 0, then 2 and 1
    assert [n for n, _ in measured[0][1]] == [3, 5] and all(t > 0 for _, t in measured[0][1])
    assert not engine.has_work and engine.planner is None
    assert greedy(engine, 15) == before


@pytest.mark.parametrize("chain", [False, True])
def test_plain_bursts_are_priced_per_step(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, chain: bool
) -> None:
    """An engine that runs k = 0 steps in bursts of 4 (``plain_burst``) is timed per step:
    with a clock that advances one second per ``engine.step()`` call, a k = 0 point costs a
    quarter of a second and a drafting point a whole one. Chained (``plain_chain``, the CUDA
    default) a call still returns one burst, and the profile's aborts leave the engine idle."""
    from engines.embedded import step_profile

    runner = load_runner(pair[0], pair[1], torch.device("cpu"), MAX_BATCH, 256)
    engine = Engine(runner, MAX_BATCH, 256, plain_burst=4, plain_chain=chain)
    queued = runner.plain_queue
    chained = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        chained.append(kwargs.get("after") is not None)
        return queued(*args, **kwargs)

    runner.plain_queue = counted  # type: ignore[method-assign]
    clock = {"now": 0.0}
    step = engine.step

    def ticking() -> list:  # type: ignore[type-arg]
        clock["now"] += 1.0
        return step()

    engine.step = ticking  # type: ignore[method-assign]
    monkeypatch.setattr(step_profile.time, "perf_counter", lambda: clock["now"])
    table = profile_steps(engine, [1, 2], [1, 8], timed_steps=2)
    assert [list(row) for row in table.step_time_s] == [[0.25, 1.0], [0.25, 1.0]]
    assert not engine.has_work and not engine._held_events
    assert any(chained) is chain  # the k = 0 points ran chained bursts when chaining


def test_an_engine_of_drafting_bursts_is_profiled_one_drafting_step_a_call(
    pair: tuple[Path, Path],
) -> None:
    """A CUDA engine's default drafting bursts (``spec_burst`` 4) would end a timed request
    inside a burst (its length is sized for one step a call): the profile runs drafting points
    one step a call and gives the engine its bursts back after."""
    runner = load_runner(pair[0], pair[1], torch.device("cpu"), MAX_BATCH, 256)
    engine = Engine(runner, MAX_BATCH, 256, spec_burst=4)
    calls = {"steps": 0}
    step = engine.step

    def counted() -> list:  # type: ignore[type-arg]
        assert engine.spec_burst == 1
        calls["steps"] += 1
        return step()

    engine.step = counted  # type: ignore[method-assign]
    table = profile_steps(engine, [1, 2], [1, 16], timed_steps=2)
    measured = profile_token_buckets(engine, {2: [30]}, timed_steps=2)
    assert all(t > 0 for row in table.step_time_s for t in row) and measured[0][1][0][1] > 0
    assert calls["steps"] == 5 * 3 and engine.spec_burst == 4 and not engine.has_work


def test_profile_is_a_whole_step_table_and_the_engine_stays_exact(
    pair: tuple[Path, Path],
) -> None:
    engine = engine_for(pair)
    before = greedy(engine_for(pair), 15)
    points: list[tuple[int, int]] = []
    table = profile_steps(
        engine, [1, 2, 4], [1, 8, 16], timed_steps=2, on_point=lambda b, w, s: points.append((b, w))
    )
    assert (table.batch_sizes, table.tokens_per_request) == ((1, 2, 4), (1, 8, 16))
    assert table.includes_draft and table.source == "start-up profile"
    assert all(t > 0 for row in table.step_time_s for t in row)
    assert points == [(b, w) for b in (1, 2, 4) for w in (1, 8, 16)]
    assert not engine.has_work and engine.planner is None
    assert greedy(engine, 15) == before  # the profile's steps left nothing a request reads
    single = profile_steps(engine, [1], [1, 8], timed_steps=1)
    assert single.batch_sizes == (1, 2) and single.step_time_s[0] == single.step_time_s[1]
    with pytest.raises(RuntimeError, match="idle engine"):
        engine.add(Request("busy", [1, 2], SamplingParams(max_new_tokens=4), lambda v: 0, {}))
        profile_steps(engine, [1, 2], [1, 8])


def test_the_cache_is_keyed_by_model_and_device(pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = pair
    engine = engine_for(pair)
    kernels = engine.runner.kernel_settings()
    assert kernels["attention"] == "sdpa" and kernels["compiled"] is False
    key = cache_key(target, draft, "cpu", MAX_BATCH, 256, kernels)
    assert key == cache_key(target, draft, "cpu", MAX_BATCH, 256, dict(kernels))
    assert key != cache_key(target, draft, "cuda:0", MAX_BATCH, 256, kernels)
    assert key != cache_key(target, draft, "cpu", MAX_BATCH * 2, 256, kernels)
    for name, other in (("attention", "triton"), ("verify_mode", "padded"), ("compiled", "layer")):
        # another kernel, verify layout or compile times steps differently: measure again
        assert key != cache_key(target, draft, "cpu", MAX_BATCH, 256, {**kernels, name: other})
    first, origin = cached_or_profiled(engine, key, tmp_path, MAX_BATCH, {"target": "t"})
    assert origin.startswith("profiled") and (tmp_path / f"steps-{key}.json").is_file()
    assert engine.runner.per_row_widths  # steps are packed on the CPU: rows at their own widths
    assert first.tokens_per_request == (1, 2, 4, 8, 12, 16)
    again, origin = cached_or_profiled(engine, key, tmp_path, MAX_BATCH, {"target": "t"})
    assert origin.startswith("cached") and again.step_time_s == first.step_time_s
    assert again.includes_draft
    weights = target / "model.safetensors"
    status = weights.stat()
    os.utime(weights, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))
    assert (
        cache_key(target, draft, "cpu", MAX_BATCH, 256, kernels) != key
    )  # new weights: measure again
    (tmp_path / f"steps-{key}.json").write_text("{not json")
    _, origin = cached_or_profiled(engine, key, tmp_path, MAX_BATCH, {})
    assert origin.startswith("profiled")  # an unreadable cache is measured again


def table(includes_draft: bool) -> CostTable:
    return CostTable(
        (1, 2), (1, 8, 16), ((1.0, 2.0, 3.0), (1.5, 2.5, 3.5)), includes_draft=includes_draft
    )


def test_a_whole_step_table_adds_no_draft_term() -> None:
    whole = CostModel(table(True), block_size=16, draft_cost_fraction=0.5)
    split = CostModel(table(False), block_size=16, draft_cost_fraction=0.5)
    assert whole.base_step_time_s(1, 8, 1.0) == 2.0
    assert split.base_step_time_s(1, 8, 1.0) == 2.0 + 0.5 * 3.0
    assert CostTable.from_dict(table(True).to_dict()) == table(True)


def test_the_policy_prices_steps_with_the_profile_only_without_a_table_of_its_own() -> None:
    spec = PolicySpec(kind="goodput")
    bare = OnlineModels(spec.goodput, 16)
    controller = StepController(FixedPolicySource(spec, GoodputPolicy(GoodputSpec()), bare), 16)
    controller.start(Task.CHAT, 1.0, 0)
    assert bare.cost is None  # no profile yet: the relative fallback prices steps
    controller.offer_cost_table(table(True))  # adopted at once, before any request
    assert bare.cost is not None and bare.cost.table.includes_draft
    own = OnlineModels(spec.goodput, 16, table(False))
    other = StepController(FixedPolicySource(spec, GoodputPolicy(GoodputSpec()), own), 16)
    other.offer_cost_table(table(True))
    other.start(Task.MATH, 1.0, 0)
    assert own.cost is not None and not own.cost.table.includes_draft  # the policy's own wins


def test_a_ragged_engines_profile_prices_every_k_on_its_own() -> None:
    """The engine's verify width multiple comes with its table: on an engine whose rows verify
    at their own widths (``StepController.ragged``) every k is priced at k + 1 tokens; on a
    padded one the policy's multiple (8) still pads k = 4 up to the width of k = 7."""
    spec = PolicySpec(kind="goodput")
    priced = {}
    for ragged in (False, True):
        models = OnlineModels(spec.goodput, 16)
        source = FixedPolicySource(spec, GoodputPolicy(GoodputSpec()), models)
        controller = StepController(source, 16, ragged=ragged)
        controller.offer_cost_table(table(True))
        assert models.cost is not None
        assert models.cost.verify_width_multiple == (1 if ragged else 8)
        snapshot = models.cost.snapshot()
        priced[ragged] = [snapshot.step_time_s(1, k) for k in (4, 7)]
    assert priced[False][0] == priced[False][1]  # padded: one width, one price
    assert priced[True][0] < priced[True][1]  # ragged: 5 tokens cost less than 8


def test_a_ragged_engines_shared_k_is_priced_at_the_counts_its_steps_run() -> None:
    """With every k a candidate (a ragged engine's multiple of 1), the policy's own step cost
    prices a shared k at the captured count its step runs, as the budget rules do: 64 rows at
    k = 6 (448 tokens) pay the stair past 384 like k = 7 (512), where the widths' line made
    k = 6 look cheaper; steps of rows whose graph is not a bucketed one (16 rows), plain
    steps, and padded engines keep the line."""
    table = stair_cost(True)._model.table
    ragged = CostModel(table, block_size=16, verify_width_multiple=1).snapshot()
    line = CostModel(
        CostTable(
            table.batch_sizes, table.tokens_per_request, table.step_time_s, includes_draft=True
        ),
        block_size=16,
        verify_width_multiple=1,
    ).snapshot()
    for k in (5, 6, 7, 9):
        assert ragged.step_time_s(64, k) == pytest.approx(stair_step_s(64, k + 1))
    assert ragged.step_time_s(64, 6) > line.step_time_s(64, 6)  # the stair the line hides
    assert ragged.step_time_s(48, 6) != line.step_time_s(48, 6)  # 48 rows run the 64-row graphs
    for batch, k in ((16, 6), (64, 0)):
        assert ragged.step_time_s(batch, k) == pytest.approx(line.step_time_s(batch, k))
    padded = CostModel(table, block_size=16, verify_width_multiple=8).snapshot()
    assert padded.step_time_s(64, 4) == pytest.approx(line.step_time_s(64, 7))
