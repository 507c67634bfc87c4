"""``ModelRunner(defer_context=True)``: k = 0 steps stash the draft's context and insert it
before the row drafts again. The draft must then see exactly the context it would have had,
so tokens and accept lengths match a runner that inserts at every step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from engines.embedded.runner import DEFERRED_POSITIONS
from tests.engines.embedded.conftest import BLOCK_SIZE, fixed_k, greedy_request, random_prompt
from tests.engines.embedded.test_lossless import PROMPT_LEN


@pytest.mark.parametrize(("graphs", "sampled"), [(False, False), (True, False), (True, True)])
def test_deferred_context_steps_as_the_inserted_one(
    agreeing_pair: tuple[Path, Path], graphs: bool, sampled: bool
) -> None:
    """Two engines in lockstep, one deferring: rows plain-decode in runs longer than the stash
    (so it fills and is inserted) and shorter, then draft; requests join and leave (slots
    move); greedy or sampled rows. Every few steps the deferring engine's stash is inserted
    and both draft caches must hold the same context for every running row; tokens and
    accept lengths match throughout."""
    engines, counts = [], []
    for defer in (True, False):
        runner = load_runner(
            *agreeing_pair,
            torch.device("cpu"),
            4,
            128,
            use_cuda_graphs=graphs,
            defer_context=defer,
        )
        inserts = {"calls": 0, "full": 0}
        insert = runner._insert_deferred

        def counted(rows, eager, inserts=inserts, insert=insert):  # type: ignore[no-untyped-def]
            inserts["calls"] += 1
            inserts["full"] += any(r.pending_context >= DEFERRED_POSITIONS for r in rows)
            return insert(rows, eager)

        runner._insert_deferred = counted  # type: ignore[method-assign]
        engines.append(Engine(runner, 4, 128))
        counts.append(inserts)
    requests = [
        [
            Request(
                f"r{i}",
                random_prompt(60 + i, PROMPT_LEN),
                SamplingParams(
                    max_new_tokens=30 + 6 * i,
                    temperature=0.9 if sampled and i % 2 else 0.0,
                    top_p=0.95,
                    seed=200 + i,
                ),
                lambda view, i=i: BLOCK_SIZE - 1 if view.step_index in (3 + i, 22 + i) else 0,
                {},
            )
            for i in range(5)
        ]
        for _ in engines
    ]
    pending = [list(r) for r in requests]
    steps = 0
    while any(e.has_work for e in engines) or pending[0]:
        for engine, waiting in zip(engines, pending, strict=True):
            if waiting and len(engine.scheduler.running) < 3:
                engine.add(waiting.pop(0))
            engine.step()
        steps += 1
        deferring, inserting = engines
        rows = list(deferring.scheduler.running)
        assert [r.slot for r in rows] == [r.slot for r in inserting.scheduler.running]
        if steps % 19 == 0 and rows:  # not every step: stashes also fill up between
            deferring.runner._insert_deferred(rows, eager=False)
            for row in rows:
                ours = deferring.runner.draft_cache.k[:, row.slot, :, : row.position]
                theirs = inserting.runner.draft_cache.k[:, row.slot, :, : row.position]
                torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    deferred, inserted = ([(r.output_ids, r.accept_lengths) for r in rs] for rs in requests)
    assert deferred == inserted
    assert any(max(lengths) > 1 for _, lengths in deferred)  # the drafts were accepted
    assert counts[0]["full"] > 0 and counts[0]["calls"] > counts[0]["full"]


def test_the_inserted_stash_is_the_context_a_prefill_writes(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """After plain steps (more than a stash: it fills once) and the insert, the draft's cache
    holds what a fresh prefill of the whole sequence writes."""
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 2, 96, defer_context=True)
    engine = Engine(runner, 2, 96)
    request = greedy_request("d", random_prompt(9, PROMPT_LEN), 40, fixed_k(0))
    engine.add(request)
    for _ in range(DEFERRED_POSITIONS + 6):  # the prefill, then plain steps
        engine.step()
    assert 0 < request.pending_context < DEFERRED_POSITIONS
    runner._insert_deferred([request], eager=False)
    assert request.pending_context == 0
    position = request.position
    fresh = load_runner(*agreeing_pair, torch.device("cpu"), 1, 96)
    probe = greedy_request("p", request.prompt_ids + request.output_ids[:-1], 1, fixed_k(0))
    probe.slot = 0
    fresh.prefill(probe, torch.zeros(2 * BLOCK_SIZE + 1))
    ours, reference = runner.draft_cache, fresh.draft_cache
    torch.testing.assert_close(
        ours.k[:, 0, :, :position], reference.k[:, 0, :, :position], atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        ours.v[:, 0, :, :position], reference.v[:, 0, :, :position], atol=1e-5, rtol=0
    )


def test_settings_name_the_deferral(agreeing_pair: tuple[Path, Path]) -> None:
    """The cost profile's key tells a deferring runner apart (its k = 0 steps cost less)."""
    on = load_runner(*agreeing_pair, torch.device("cpu"), 2, 64, defer_context=True)
    off = load_runner(*agreeing_pair, torch.device("cpu"), 2, 64)
    assert on.kernel_settings()["defer_context"] is True
    assert off.kernel_settings()["defer_context"] is False
