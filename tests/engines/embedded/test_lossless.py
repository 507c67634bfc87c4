"""Greedy speculative output is exactly target-only greedy output, whatever k the controller
picks, per step and per request, while requests join and leave the batch."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import RequestView, SamplingParams
from engines.embedded.request import Request
from tests.engines.embedded.conftest import (
    BLOCK_SIZE,
    fixed_k,
    greedy_request,
    make_engine,
    random_prompt,
)
from tests.tinymodels import IM_END_ID, write_tiny_pair

transformers = pytest.importorskip("transformers")

NUM_PROMPTS = 200  # every k setting runs all of them
NUM_FIXED_K_PROMPTS = 200
PROMPT_LEN = 10


def target_only_greedy(
    target_dir: Path, prompts: list[list[int]], max_new_tokens: int
) -> list[list[int]]:
    """transformers' greedy decoding of the target alone (equal-length prompts, one batch)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    ids = torch.tensor(prompts)
    # Explicit all-ones mask: otherwise generate() treats prompt tokens equal to pad as padding.
    out = model.eval().generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=IM_END_ID,
        eos_token_id=None,
    )
    return out[:, PROMPT_LEN:].tolist()


def random_k(seed: int) -> Callable[[RequestView], int]:
    rng = random.Random(seed)
    return lambda view: rng.randint(0, BLOCK_SIZE - 1)


def run_staggered(engine: Engine, requests: list[Request]) -> list[int]:
    """Add 3 requests, then one more before every step; returns the batch size of each step."""
    pending = list(requests)
    for _ in range(3):
        engine.add(pending.pop(0))
    sizes = []
    while engine.has_work or pending:
        if pending:
            engine.add(pending.pop(0))
        sizes.append(len(engine.step()))
    return sizes


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return [random_prompt(1000 + i, PROMPT_LEN) for i in range(NUM_PROMPTS)]


@pytest.fixture(scope="module")
def expected(agreeing_pair: tuple[Path, Path], prompts: list[list[int]]) -> list[list[int]]:
    return target_only_greedy(agreeing_pair[0], prompts, 20)


@pytest.mark.parametrize("k", [0, 1, 4, BLOCK_SIZE - 1, "random"])
def test_greedy_equals_target_only_greedy(k, agreeing_pair, prompts, expected) -> None:
    engine = make_engine(agreeing_pair, max_batch_size=8)
    lengths = [8 + (i * 7) % 13 for i in range(NUM_PROMPTS)]  # requests leave at different steps
    num_prompts = NUM_PROMPTS if k == "random" else NUM_FIXED_K_PROMPTS
    requests = [
        greedy_request(str(i), p, lengths[i], random_k(i) if k == "random" else fixed_k(k))
        for i, p in enumerate(prompts[:num_prompts])
    ]
    batch_sizes = run_staggered(engine, requests)
    for i, request in enumerate(requests):
        assert request.output_ids == expected[i][: lengths[i]], f"prompt {i}, k={k}"
        assert request.finish_reason == "length"
    accept = [a for r in requests for a in r.accept_lengths]
    assert len(set(batch_sizes)) > 2, "batch size never changed: joins/leaves not exercised"
    if k == 0:
        assert set(accept) == {1}
    else:  # the agreeing pair accepts multi-token runs; k bounds the accept length
        assert max(accept) == (k if k != "random" else BLOCK_SIZE - 1) + 1


def test_plain_random_pair_is_lossless_with_random_k(tiny_pair) -> None:
    prompts = [random_prompt(5000 + i, PROMPT_LEN) for i in range(48)]
    expected = target_only_greedy(tiny_pair[0], prompts, 16)
    engine = make_engine(tiny_pair, max_batch_size=8)
    requests = [greedy_request(str(i), p, 16, random_k(i)) for i, p in enumerate(prompts)]
    run_staggered(engine, requests)
    assert [r.output_ids for r in requests] == expected


def test_stop_token_ends_output_like_target_greedy(agreeing_pair, prompts, expected) -> None:
    engine = make_engine(agreeing_pair)
    checked = 0
    for i in range(20):
        stop = expected[i][5]  # a token the target emits mid-sequence
        params = SamplingParams(max_new_tokens=20, stop_token_ids=(stop,))
        request = Request(str(i), prompts[i], params, fixed_k(BLOCK_SIZE - 1), {})
        engine.add(request)
        while engine.has_work:
            engine.step()
        cut = expected[i].index(stop) + 1
        assert request.output_ids == expected[i][:cut]
        assert request.finish_reason == "stop"
        checked += 1
    assert checked == 20


def test_k0_steps_still_update_the_draft_context(agreeing_pair) -> None:
    """After k=0 steps the draft cache holds the same context K/V as a fresh prefill of the
    whole sequence, so turning drafting back on finds a complete context."""
    engine = make_engine(agreeing_pair, max_batch_size=2)
    switch_step = 6
    request = greedy_request(
        "b",
        random_prompt(7, PROMPT_LEN),
        30,
        lambda v: 0 if v.step_index < switch_step else BLOCK_SIZE - 1,
    )
    engine.add(request)
    for _ in range(switch_step + 1):  # prefill + switch_step plain decode steps
        engine.step()
    position = request.position
    cache = engine.runner.draft_cache
    after_k0 = (cache.k[:, 0, :, :position].clone(), cache.v[:, 0, :, :position].clone())
    fresh = make_engine(agreeing_pair, max_batch_size=1)
    probe = greedy_request("p", request.prompt_ids + request.output_ids[:-1], 1, fixed_k(0))
    probe.slot = 0
    fresh.runner.prefill(probe, torch.zeros(2 * BLOCK_SIZE + 1))
    reference = fresh.runner.draft_cache
    torch.testing.assert_close(after_k0[0], reference.k[:, 0, :, :position], atol=1e-5, rtol=0)
    torch.testing.assert_close(after_k0[1], reference.v[:, 0, :, :position], atol=1e-5, rtol=0)
    while engine.has_work:
        engine.step()
    resumed = request.accept_lengths[switch_step:]
    assert sum(resumed) / len(resumed) > 2.0, resumed


@pytest.mark.parametrize(("graphs", "sampled"), [(False, False), (True, False), (True, True)])
def test_the_plain_fast_path_steps_as_the_general_step(agreeing_pair, graphs, sampled) -> None:
    """Steps with every row at k = 0 take ``ModelRunner._plain_step``; with it off they take
    the general step. Same tokens, same accept lengths, same draft context, on the eager runner
    and on the graph runner (static calls on the CPU), greedy or with sampled rows (seeded:
    the bonus uniform is the general step's), while requests join and leave and some steps
    draft."""
    from engines.embedded.loader import load_runner

    runs = []
    for fast in (True, False):
        runner = load_runner(*agreeing_pair, torch.device("cpu"), 4, 96, use_cuda_graphs=graphs)
        runner.plain_fast_path = fast
        engine = Engine(runner, 4, 96)
        steps = {"plain": 0}
        plain_step = runner._plain_step

        def counted(*args, steps=steps, plain_step=plain_step, **kwargs):
            steps["plain"] += 1
            return plain_step(*args, **kwargs)

        runner._plain_step = counted  # type: ignore[method-assign]
        requests = [
            Request(
                f"r{i}",
                random_prompt(40 + i, PROMPT_LEN),
                SamplingParams(
                    max_new_tokens=12 + 5 * i,
                    temperature=0.9 if sampled and i % 2 else 0.0,
                    top_p=0.95,
                    seed=100 + i,
                ),
                lambda view, i=i: 0 if (view.step_index + i) % 5 else 3,
                {},
            )
            for i in range(5)
        ]
        run_staggered(engine, requests)
        cache = runner.draft_cache
        runs.append(
            (
                [(r.output_ids, r.accept_lengths) for r in requests],
                cache.k.clone(),
                steps["plain"],
            )
        )
    (tokens_fast, cache_fast, plain_fast), (tokens_general, cache_general, plain_general) = runs
    assert tokens_fast == tokens_general
    torch.testing.assert_close(cache_fast, cache_general, atol=1e-6, rtol=0)
    assert plain_fast > 0 and plain_general == 0


@pytest.mark.parametrize("k", [15, "random"])
def test_block16_pair_is_lossless(k, tmp_path) -> None:
    pair = write_tiny_pair(tmp_path, block_size=16, bias_token_id=65, bias_strength=0.8)
    prompts = [random_prompt(7000 + i, PROMPT_LEN) for i in range(48)]
    expected = target_only_greedy(pair[0], prompts, 24)
    engine = make_engine(pair, max_batch_size=8)
    controller = (lambda i: random_k16(i)) if k == "random" else (lambda i: fixed_k(15))
    requests = [greedy_request(str(i), p, 24, controller(i)) for i, p in enumerate(prompts)]
    run_staggered(engine, requests)
    assert [r.output_ids for r in requests] == expected
    assert max(a for r in requests for a in r.accept_lengths) > 8  # beyond an 8-wide verify


def random_k16(seed: int) -> Callable[[RequestView], int]:
    rng = random.Random(seed)
    return lambda view: rng.randint(0, 15)
