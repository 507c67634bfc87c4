"""The forwards stay compilable as one graph (``torch_compile``) and compute what eager does.

The option itself is for CUDA (compiled forwards are captured into CUDA graphs); on CPU the
runner refuses it, so these tests compile the runner's forwards directly, as the capture does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.fx.experimental._config as shape_config
from torch._dynamo.utils import counters

from engines.embedded import regional
from engines.embedded.events import SamplingParams, SpecController
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from tests.engines.embedded.conftest import fixed_k, random_prompt


@pytest.fixture(autouse=True)
def _restore_shape_settings() -> Iterator[None]:
    """``compile_layers`` sets symbolic-shape settings process-wide (regional.py); each test
    here restores them (the config module's own patch: pytest's monkeypatch cannot restore a
    torch config module's attributes)."""
    names = ("backed_size_oblivious", "use_duck_shape")
    with shape_config.patch(
        **{name: getattr(shape_config, name) for name in names if hasattr(shape_config, name)}
    ):
        yield


def test_compile_without_cuda_graphs_is_refused(tiny_pair: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="needs CUDA graphs"):
        load_runner(*tiny_pair, torch.device("cpu"), 2, 64, compile_forwards=True)


@torch.inference_mode()
def test_compiled_forwards_match_eager_without_graph_breaks(
    agreeing_pair: tuple[Path, Path],
) -> None:
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 2, 64)
    ids = torch.tensor([[65, 66], [70, 65]])
    positions = torch.tensor([[3, 4], [9, 10]])
    block = torch.full((2, runner.block_size), runner.mask_token_id)
    block[:, 0] = ids[:, 0]
    block_positions = positions[:, :1] + torch.arange(runner.block_size)
    eager_logits = runner._verify_forward(ids, positions)
    eager_cache = runner.draft_cache.k.clone()
    eager_draft = runner._draft_forward(block, block_positions)
    torch._dynamo.reset()
    # fullgraph=True: a graph break anywhere in either forward fails here.
    verify = torch.compile(runner._verify_forward, fullgraph=True, dynamic=False)
    draft = torch.compile(runner._draft_forward, fullgraph=True, dynamic=False)
    runner.draft_cache.k.zero_()
    torch.testing.assert_close(verify(ids, positions), eager_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(runner.draft_cache.k, eager_cache)  # context written in place
    torch.testing.assert_close(draft(block, block_positions), eager_draft, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_regional_compile_serves_every_layer_with_one_graph(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """``compile_scope: layer``: the target's decoder-layer step compiled once serves every
    layer (their weights are its inputs), computes what eager does, and its K/V writes land in
    the engine's cache (they go through views of it); the draft's likewise."""
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 2, 64)
    assert runner.target.shape.num_layers >= 2
    ids = torch.tensor([[65, 66], [70, 65]])
    positions = torch.tensor([[3, 4], [9, 10]])
    eager_logits = runner._verify_forward(ids, positions)
    eager_k, eager_v = runner.target_cache.k.clone(), runner.target_cache.v.clone()
    torch._dynamo.reset()
    counters.clear()
    runner.target.compile_layers()
    runner.target_cache.k.zero_()
    runner.target_cache.v.zero_()
    torch.testing.assert_close(
        runner._verify_forward(ids, positions), eager_logits, rtol=1e-4, atol=1e-4
    )
    torch.testing.assert_close(runner.target_cache.k, eager_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runner.target_cache.v, eager_v, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1  # one compile for all the layers
    # The draft's propose: the same for its layer step (the glue around it stays eager).
    block = torch.full((2, runner.block_size), runner.mask_token_id)
    block[:, 0] = ids[:, 0]
    block_positions = positions[:, :1] + torch.arange(runner.block_size)
    eager_draft = runner._draft_forward(block, block_positions)
    runner.draft.compile_layers()
    torch.testing.assert_close(
        runner._draft_forward(block, block_positions), eager_draft, rtol=1e-4, atol=1e-4
    )
    assert counters["stats"]["unique_graphs"] == 2  # the draft's layer step: one more
    assert runner.draft.spec.shape.num_layers >= 1


def test_an_unknown_compile_scope_is_refused(tiny_pair: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="compile_scope='model': use one of forward, layer"):
        load_runner(*tiny_pair, torch.device("cpu"), 2, 64, compile_scope="model")  # type: ignore[arg-type]


def test_compile_mode_reaches_torch_compile(
    tiny_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compile_mode: max-autotune`` compiles both layer steps with inductor's max-autotune
    without its CUDA graphs (the runner captures its own); ``coordinate-descent`` only turns
    on inductor's coordinate-descent tuning; ``default`` passes neither; an unknown mode is
    refused by name."""
    seen: list[object] = []

    def spy(fn: object, **kwargs: object) -> object:
        seen.append({k: v for k, v in kwargs.items() if k in ("mode", "options")})
        return fn

    monkeypatch.setattr(torch, "compile", spy)
    cases = (
        ("max-autotune", {"mode": "max-autotune-no-cudagraphs"}),
        ("coordinate-descent", {"options": {"coordinate_descent_tuning": True}}),
        ("default", {}),
    )
    for mode, want in cases:
        seen.clear()
        load_runner(
            *tiny_pair,
            torch.device("cpu"),
            1,
            64,
            use_cuda_graphs=True,
            compile_forwards=True,
            compile_scope="layer",
            compile_mode=mode,  # type: ignore[arg-type]
        )
        assert seen == [want, want]  # the target's layer step and the draft's
    with pytest.raises(
        ValueError,
        match="compile_mode='fast': use one of default, max-autotune, coordinate-descent",
    ):
        load_runner(*tiny_pair, torch.device("cpu"), 1, 64, compile_mode="fast")  # type: ignore[arg-type]


@torch.inference_mode()
def test_regional_compile_marks_the_varying_sizes_dynamic_up_front(
    agreeing_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the verify shapes a capture meets (largest first: batch × width), the target's
    layer step compiles once for every batch and width above 1 and once for each of batch 1,
    width 1 and both (dynamo's defaults compiled it 7 times here: a width change, a batch
    change and the stride of an expanded input each recompiled); the draft's once for batches
    above 1 and once for batch 1. Every shape computes what eager does. (dynamo's own
    ``aot_eager`` backend: the guards and graphs are dynamo's; inductor's kernels are checked
    on the GPU, bench/ragged_gpu_check.py.)"""
    monkeypatch.setattr(regional, "inductor_arguments", lambda mode: {"backend": "aot_eager"})
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 8, 64)
    generator = torch.Generator().manual_seed(0)
    shapes = [(batch, width) for batch in (8, 4, 2, 1) for width in (8, 4, 1)]
    inputs = {
        (b, w): (
            torch.randint(0, 100, (b, w), generator=generator),
            torch.arange(w) + torch.randint(0, 40, (b, 1), generator=generator),
        )
        for b, w in shapes
    }

    def verify_all() -> dict[tuple[int, int], torch.Tensor]:
        out = {}
        for shape in shapes:
            runner.target_cache.k.zero_()
            runner.target_cache.v.zero_()
            out[shape] = runner._verify_forward(*inputs[shape]).clone()
        return out

    def draft_all() -> dict[int, torch.Tensor]:
        out = {}
        for batch in (8, 4, 2, 1):
            block = torch.full((batch, runner.block_size), runner.mask_token_id)
            block[:, 0] = inputs[batch, 1][0][:, 0]
            positions = inputs[batch, 1][1] + torch.arange(runner.block_size)
            out[batch] = runner._draft_forward(block, positions).clone()
        return out

    eager, eager_draft = verify_all(), draft_all()
    torch._dynamo.reset()
    counters.clear()
    runner.target.compile_layers()
    compiled = verify_all()
    assert counters["stats"]["unique_graphs"] == 4
    for shape in shapes:
        torch.testing.assert_close(compiled[shape], eager[shape], rtol=1e-4, atol=1e-4)
    runner.draft.compile_layers()
    compiled_draft = draft_all()
    assert counters["stats"]["unique_graphs"] == 6  # the draft's: 2 more
    for batch, logits in compiled_draft.items():
        torch.testing.assert_close(logits, eager_draft[batch], rtol=1e-4, atol=1e-4)


def test_dense_copies_only_what_is_not_row_major() -> None:
    rows = torch.arange(4)[:, None]
    assert regional.dense(rows) is rows  # [4, 1] strides (1, 1): row-major already
    expanded = rows.expand(4, 3)  # stride 0
    out = regional.dense(expanded)
    assert out.stride() == (3, 1) and torch.equal(out, expanded)
    single = torch.zeros(1, 8)[:, None].expand(1, 3, 8).reshape(1, 24)
    assert regional.dense(single).stride() == (24, 1)
    odd = torch.zeros(5, 1, 4).as_strided((1, 1, 4), (7, 9, 1))  # size-1 strides arbitrary
    assert regional.dense(odd).stride() == (4, 4, 1)


def test_keep_allocator_cache_skips_the_cache_emptying_and_restores_it() -> None:
    """What ``torch.cuda.graph`` calls on entry does nothing inside, and comes back after, also
    when the capture raises (a later capture, or the caller, empties the cache again)."""
    from engines.embedded.cuda_graphs import keep_allocator_cache

    def host() -> object:  # a CPU build of torch has no host cache to empty
        return getattr(torch._C, "_host_emptyCache", None)

    device, saved_host = torch.cuda.empty_cache, host()
    with keep_allocator_cache():
        assert torch.cuda.empty_cache is not device
        assert saved_host is None or host() is not saved_host
        assert torch.cuda.empty_cache() is None
    assert torch.cuda.empty_cache is device and host() is saved_host
    with pytest.raises(RuntimeError, match="capture failed"):
        with keep_allocator_cache():
            raise RuntimeError("capture failed")
    assert torch.cuda.empty_cache is device and host() is saved_host


@torch.inference_mode()
def test_eager_forwards_run_the_plain_layer_steps(
    agreeing_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``compile_scope: layer`` the forwards outside the CUDA graphs (batched prefills of
    any rows x prompt lengths, packed) run the plain layer steps: nothing compiles for them (a
    packed prefill through the compiled step fails on SDPA's mask, and every new shape would
    compile again), they compute what an uncompiled runner does, and the compiled steps are
    back afterwards for the graphs."""
    monkeypatch.setattr(regional, "inductor_arguments", lambda mode: {"backend": "aot_eager"})
    compiled, plain = (load_runner(*agreeing_pair, torch.device("cpu"), 4, 64) for _ in range(2))
    torch._dynamo.reset()
    counters.clear()
    compiled.target.compile_layers()
    compiled.draft.compile_layers()
    steps = (compiled.target.layer_step, compiled.draft.layer_step)
    generator = torch.Generator().manual_seed(0)
    for trial, lengths in enumerate(([5, 12, 9], [17, 3], [8, 8, 8, 8], [29, 4, 11])):
        firsts = []
        for runner in (compiled, plain):
            requests = [
                Request(f"r{trial}.{i}", random_prompt(7 * trial + i, length=n), *_greedy())
                for i, n in enumerate(lengths)
            ]
            for slot, request in enumerate(requests):
                request.slot = slot
            uniforms = torch.rand(len(lengths), 4, generator=generator.manual_seed(trial))
            firsts.append(runner.prefill_many(requests, uniforms))
        assert firsts[0] == firsts[1]
        for kv in ("k", "v"):
            torch.testing.assert_close(
                getattr(compiled.target_cache, kv), getattr(plain.target_cache, kv)
            )
    assert counters["stats"]["unique_graphs"] == 0
    assert (compiled.target.layer_step, compiled.draft.layer_step) == steps
    assert compiled.target.compiled_layers and compiled.draft.compiled_layers


def _greedy() -> tuple[SamplingParams, SpecController, dict[str, object]]:
    return SamplingParams(max_new_tokens=4), fixed_k(0), {}


@torch.inference_mode()
def test_a_compiled_engine_serves_mixed_prompts_losslessly(
    agreeing_pair: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """End to end with ``compile_scope: layer`` (dynamo's ``aot_eager``; static calls stand in
    for CUDA graphs on the CPU): requests of different prompt lengths admitted together
    (batched, packed prefills) and verified at per-row k on ragged steps emit target-only
    greedy tokens, and no batched prefill fails (session 35's H100 call: every one did)."""
    from engines.embedded.engine import Engine
    from tests.engines.embedded.test_lossless import PROMPT_LEN, target_only_greedy
    from tests.engines.embedded.test_ragged import run

    monkeypatch.setattr(regional, "inductor_arguments", lambda mode: {"backend": "aot_eager"})
    torch._dynamo.reset()
    runner = load_runner(
        *agreeing_pair,
        torch.device("cpu"),
        4,
        64,
        use_cuda_graphs=True,
        verify_mode="ragged",
        compile_forwards=True,
        compile_scope="layer",
    )
    prompts = [random_prompt(500 + i, length=n) for i, n in enumerate((10, 14, 18, 12, 16, 11))]
    with caplog.at_level("WARNING", logger="engines.embedded.engine"):
        requests = run(Engine(runner, 4, 64), prompts)
    # (target_only_greedy cuts PROMPT_LEN tokens off: the rest of a longer prompt first)
    want = [
        target_only_greedy(agreeing_pair[0], [p], 24)[0][len(p) - PROMPT_LEN :] for p in prompts
    ]
    assert [r.output_ids for r in requests] == want
    assert "batched prefill failed" not in caplog.text
