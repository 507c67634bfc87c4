"""Culprit search on a CUDA-graph runner (skipped without CUDA). Its probes run eagerly, so
they write only their own rows' slots: a row failing mid-generation costs only itself, and
the other rows emit exactly what they emit when that row is aborted at the same step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import RequestFailed, SamplingParams
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from tests.engines.embedded.conftest import BLOCK_SIZE, fixed_k, random_prompt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BAD, FAIL_AFTER = "r1", 3  # r1 sits in slot 1 of six: a probe of rows[:3] pads to 4 slots


def graph_engine(pair: tuple[Path, Path]) -> Engine:
    device = torch.device("cuda")
    runner = load_runner(pair[0], pair[1], device, 8, 256, True, dtype=torch.float32)
    return Engine(runner, 8, 256)


def six_requests() -> list[Request]:
    return [
        Request(
            f"r{i}",
            random_prompt(i, 12 + 3 * i),
            SamplingParams(max_new_tokens=40),
            fixed_k((3 * i + 1) % BLOCK_SIZE),
            {},
        )
        for i in range(6)
    ]


def run_aborting(engine: Engine, requests: list[Request]) -> None:
    """The reference: BAD is aborted before the step in which it would fail."""
    for request in requests:
        engine.add(request)
    while engine.has_work:
        bad = requests[1]
        if bad.slot >= 0 and len(bad.output_ids) >= FAIL_AFTER:
            engine.abort(BAD)
        engine.step()


def run_poisoned(engine: Engine, requests: list[Request], graph_probes: bool = False) -> list:
    """BAD's row makes the step raise once it has FAIL_AFTER tokens; returns the probes'
    batch sizes. ``graph_probes`` replays graphs for the probes too (what must not be done)."""
    real_step = engine.runner.step
    probes: list[int] = []

    def step(rows, spec_tokens, uniforms, eager=False, overlap=None):
        if eager:
            probes.append(len(rows))
        if any(r.request_id == BAD and len(r.output_ids) >= FAIL_AFTER for r in rows):
            raise RuntimeError("injected step failure")
        return real_step(
            rows, spec_tokens, uniforms, eager=eager and not graph_probes, overlap=overlap
        )

    engine.runner.step = step  # type: ignore[method-assign]
    for request in requests:
        engine.add(request)
    failed = []
    while engine.has_work:
        failed += [r.request_id for r, e in engine.step() if isinstance(e, RequestFailed)]
    assert failed == [BAD]
    return probes


def committed(engine: Engine, requests: list[Request]) -> list[torch.Tensor]:
    """Every cache entry a later step reads: positions [0, position) of each row's slot."""
    runner = engine.runner
    caches = [c for cache in (runner.target_cache, runner.draft_cache) for c in (cache.k, cache.v)]
    return [c[:, r.slot, :, : r.position].clone() for r in requests for c in caches]


def test_a_probe_on_a_graph_runner_writes_only_scratch_of_its_rows(tiny_pair) -> None:
    """The sensitive check: the same probe replayed as a padded graph (eager=False) changed 4
    of these 24 tensors (slot 3's prompt K/V) on an H200, the eager one none."""
    engine = graph_engine(tiny_pair)
    requests = six_requests()
    for request in requests:
        engine.add(request)
    engine.step()
    engine.step()
    before = committed(engine, requests)
    uniforms = torch.zeros(3, 2 * BLOCK_SIZE + 1)
    engine.runner.step(requests[:3], [BLOCK_SIZE - 1, 2, 4], uniforms, eager=True)
    after = committed(engine, requests)
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))


@pytest.mark.parametrize("pair", ["tiny_pair", "agreeing_pair"])
def test_graph_runner_isolates_a_failing_row(pair, request) -> None:
    """End to end (on these tiny models even graph-replayed probes left the tokens as they
    were, so the cache test above is the one that catches a probe writing live slots)."""
    pair = request.getfixturevalue(pair)
    reference = six_requests()
    run_aborting(graph_engine(pair), reference)
    engine = graph_engine(pair)
    poisoned = six_requests()
    probes = run_poisoned(engine, poisoned)
    assert probes and max(probes) < 6
    assert [r.output_ids for r in poisoned] == [r.output_ids for r in reference]
    assert not engine.scheduler.running and not engine.scheduler.waiting
