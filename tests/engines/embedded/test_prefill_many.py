"""Admitted requests prefilled together (``ModelRunner.prefill_many``, ``plan_prefills``): one
packed forward writes exactly the caches and draws exactly the first tokens that one prefill
per request does, and the engine falls back to one at a time when a batched prefill fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.embedded.engine import plan_prefills
from engines.embedded.events import SamplingParams
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from engines.embedded.runner import ModelRunner
from tests.engines.embedded.conftest import fixed_k, greedy_request, make_engine, random_prompt


def test_plan_prefills_keeps_rows_times_the_longest_prompt_within_the_budget() -> None:
    assert plan_prefills([10, 20, 30], budget=100) == [[0, 1, 2]]
    assert plan_prefills([10, 40, 30], budget=100) == [[0, 1], [2]]  # 3 x 40 > 100
    assert plan_prefills([200, 5, 5], budget=100) == [[0], [1, 2]]  # a long prompt alone
    assert plan_prefills([], budget=100) == []
    for lengths in ([7] * 50, [3, 90, 4, 60, 2, 2, 2]):
        groups = plan_prefills(lengths, budget=128)
        assert [i for g in groups for i in g] == list(range(len(lengths)))
        assert all(len(g) == 1 or len(g) * max(lengths[i] for i in g) <= 128 for g in groups)


def _runner(pair: tuple[Path, Path]) -> ModelRunner:
    return load_runner(*pair, torch.device("cpu"), 4, 64)


@torch.inference_mode()
def test_prefill_many_equals_one_prefill_per_request(agreeing_pair: tuple[Path, Path]) -> None:
    together, alone = _runner(agreeing_pair), _runner(agreeing_pair)
    prompts = [random_prompt(n, length=n) for n in (5, 12, 9)]
    params = [SamplingParams(max_new_tokens=4), SamplingParams(max_new_tokens=4, temperature=0.8)]
    requests = [Request(f"r{i}", p, params[i % 2], fixed_k(0), {}) for i, p in enumerate(prompts)]
    for slot, request in enumerate(requests):
        request.slot = slot
    uniforms = torch.rand(3, 9, generator=torch.Generator().manual_seed(0))
    got = together.prefill_many(requests, uniforms)
    want = [alone.prefill(r, uniforms[i]) for i, r in enumerate(requests)]
    assert got == want
    for cache in ("target_cache", "draft_cache"):
        mine, theirs = getattr(together, cache), getattr(alone, cache)
        for slot, prompt in enumerate(prompts):
            for kv in ("k", "v"):
                a = getattr(mine, kv)[:, slot, :, : len(prompt)]
                b = getattr(theirs, kv)[:, slot, :, : len(prompt)]
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    requests[2].slot = 3
    with pytest.raises(ValueError, match="consecutive slots"):
        together.prefill_many(requests, uniforms)


def test_a_failing_batched_prefill_fails_only_its_culprit(
    agreeing_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(agreeing_pair)
    requests = [greedy_request(f"r{i}", random_prompt(i, 6 + i), 3, fixed_k(0)) for i in range(3)]
    original = engine.runner.prefill

    def prefill(request: Request, uniforms: torch.Tensor) -> int:
        if request.request_id == "r1":
            raise RuntimeError("bad prompt")
        return original(request, uniforms)

    def prefill_many(batch: list[Request], uniforms: torch.Tensor) -> list[int]:
        raise RuntimeError("one row is bad")

    monkeypatch.setattr(engine.runner, "prefill", prefill)
    monkeypatch.setattr(engine.runner, "prefill_many", prefill_many)
    for request in requests:
        engine.add(request)
    events = engine.step()
    failed = {r.request_id for r, e in events if type(e).__name__ == "RequestFailed"}
    assert failed == {"r1"}


@torch.inference_mode()
def test_a_graph_runner_prefills_one_prompt_through_its_padded_length_graph(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """The captured prefill (run as static buffers on the CPU) takes the slot as data: the
    request's slot gets the caches an eager prefill writes over its prompt, the first token
    is the same, and no other slot changes."""
    graphs = load_runner(*agreeing_pair, torch.device("cpu"), 4, 160, use_cuda_graphs=True)
    eager = load_runner(*agreeing_pair, torch.device("cpu"), 4, 160)
    assert sorted(graphs._prefill_graphs) == graphs.prefill_lengths == [64, 128, 160]
    caches = [c for cache in (graphs.target_cache, graphs.draft_cache) for c in (cache.k, cache.v)]
    for cache in caches:
        cache.normal_(generator=torch.Generator().manual_seed(4))
    before = [cache.clone() for cache in caches]
    prompt = random_prompt(5, length=70)  # padded to 128
    params = SamplingParams(max_new_tokens=4, temperature=0.7)
    for runner in (graphs, eager):
        request = Request("r", prompt, params, fixed_k(0), {})
        request.slot = 2
        uniforms = torch.rand(1, 9, generator=torch.Generator().manual_seed(1))
        first = runner._prefill_rows([request], uniforms)
        if runner is graphs:
            got = first
    assert got == first
    for name in ("target_cache", "draft_cache"):
        for kv in ("k", "v"):
            a = getattr(getattr(graphs, name), kv)[:, 2, :, : len(prompt)]
            b = getattr(getattr(eager, name), kv)[:, 2, :, : len(prompt)]
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for cache, old in zip(caches, before, strict=True):
        others = [s for s in range(cache.shape[1]) if s != 2]
        assert torch.equal(cache[:, others], old[:, others])


def test_eager_forwards_on_a_gpu_leave_cudnn_attention_out() -> None:
    """cuDNN's SDPA builds a kernel per new shape, and a batched prefill's shapes keep
    changing: the eager forwards' attention runs without it on CUDA (graphs keep the
    default); on the CPU nothing changes."""
    from engines.embedded.runner import eager_attention

    assert torch.backends.cuda.cudnn_sdp_enabled()
    with eager_attention(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with eager_attention(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled()
