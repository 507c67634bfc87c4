"""Packed (ragged) forwards compute exactly what the padded forwards compute for the tokens a
row uses, write the same caches, and make a step's rows with small k cheaper."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from engines.embedded.loader import load_runner
from engines.embedded.packing import Packing
from tests.engines.embedded.conftest import BLOCK_SIZE, make_engine, random_prompt


def test_pack_then_unpack_keeps_valid_tokens_and_zeroes_the_rest() -> None:
    packing = Packing.from_lengths(torch.tensor([1, 3, 2]), 3)
    x = torch.arange(9.0).view(3, 3)
    assert packing.num_tokens == 6
    assert packing.pack(x).tolist() == [[0.0, 3.0, 4.0, 5.0, 6.0, 7.0]]
    assert packing.unpack(packing.pack(x)).tolist() == [[0, 0, 0], [3, 4, 5], [6, 7, 0]]


@torch.inference_mode()
def test_grouped_queries_and_packed_output_match_the_layout_copies() -> None:
    """The packed attention path (queries scattered straight into the grouped layout, outputs
    gathered from it) gives bit for bit what unpack -> cached_attention -> pack gives, padding
    entries included (a graph's bucket: they scatter into the scratch row, gather token 0)."""
    from engines.embedded.layers import attention_mask, cached_attention, grouped_attention
    from engines.embedded.ragged import ragged_index

    gen = torch.Generator().manual_seed(3)
    batch, width, heads, kv_heads, dim, keys = 3, 4, 8, 2, 16, 12
    lengths = [1, 4, 2]
    index = ragged_index(lengths, batch, width, num_tokens=9)  # 7 tokens + 2 padding
    packing = Packing.from_indices((batch, width), index[0], index[1])
    # A strided view like the one ``DecoderLayer.qkv`` returns (q's heads of q and k's heads).
    qk = torch.randn(1, 9, heads + kv_heads, dim, generator=gen)
    q = qk[:, :, :heads]
    k_cache, v_cache = (torch.randn(batch, kv_heads, keys, dim, generator=gen) for _ in "kv")
    visible = torch.rand(batch, width, keys, generator=gen) < 0.7
    visible[..., 0] = True
    mask = attention_mask(visible, heads, kv_heads)
    want = packing.pack(cached_attention(packing.unpack(q), k_cache, v_cache, mask))
    for buffer in (None, torch.full(((batch * width + 1) * heads * dim,), 5.0)):
        packing.query_buffer = buffer
        grouped = packing.grouped_queries(q, kv_heads)
        assert grouped.shape == (batch, kv_heads, heads // kv_heads * width, dim)
        got = packing.packed_output(grouped_attention(grouped, k_cache, v_cache, mask), heads)
        used = sum(lengths)
        assert torch.equal(got[:, :used], want[:, :used])
    # The scratch row takes the padding writes; no real query was overwritten.
    scatter = packing.grouped_index(heads, kv_heads)[0]
    assert scatter[sum(lengths) :].eq(batch * heads * width).all()
    assert scatter[: sum(lengths)].unique().numel() == sum(lengths) * heads


@torch.inference_mode()
def test_packed_verify_and_draft_match_the_padded_forwards(
    agreeing_pair: tuple[Path, Path],
) -> None:
    padded = load_runner(*agreeing_pair, torch.device("cpu"), 3, 64)
    packed = load_runner(*agreeing_pair, torch.device("cpu"), 3, 64)
    spec_tokens = [0, 5, 2]
    width = max(spec_tokens) + 1
    ids = torch.randint(0, 256, (3, width), generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([[10], [20], [7]]) + torch.arange(width)
    for runner in (padded, packed):  # the same earlier context in both caches
        runner._verify_forward(ids, positions - width)

    verify_packing = packed._verify_packing(spec_tokens)
    assert verify_packing is not None and verify_packing.num_tokens == 10  # 1 + 6 + 3, not 3 x 6
    want = padded._verify_forward(ids, positions)
    got = packed._verify_forward(ids, positions, None, verify_packing)
    for row, k in enumerate(spec_tokens):
        torch.testing.assert_close(got[row, : k + 1], want[row, : k + 1])
        for cache in ("target_cache", "draft_cache"):
            written = positions[row, : k + 1]
            mine, theirs = getattr(packed, cache), getattr(padded, cache)
            torch.testing.assert_close(mine.k[:, row, :, written], theirs.k[:, row, :, written])
            torch.testing.assert_close(mine.v[:, row, :, written], theirs.v[:, row, :, written])

    block = torch.full((3, BLOCK_SIZE), packed.mask_token_id)
    block[:, 0] = ids[:, 0]
    block_positions = positions[:, :1] + torch.arange(BLOCK_SIZE)
    rows, outputs = packed._draft_packings(spec_tokens)
    assert rows is not None and rows.num_tokens == 2 * BLOCK_SIZE  # the k = 0 row does not draft
    want = padded._draft_forward(block, block_positions)
    got = packed._draft_forward(block, block_positions, None, rows, outputs)
    for row, k in enumerate(spec_tokens):
        torch.testing.assert_close(got[row, :k], want[row, :k])
        assert not got[row, k:].any()  # logits nobody uses are not computed


def test_mixed_k_steps_emit_the_same_tokens_packed_or_padded(
    agreeing_pair: tuple[Path, Path],
) -> None:
    from engines.embedded.events import SamplingParams
    from engines.embedded.request import Request

    outputs = []
    for pack in (True, False):
        engine = make_engine(agreeing_pair, max_batch_size=4)
        engine.runner.pack_ragged = pack
        requests = [
            Request(
                f"r{i}",
                random_prompt(i),
                SamplingParams(max_new_tokens=24),
                lambda view, i=i: (0, 7, 3, 1)[(i + view.step_index) % 4],
                {},
            )
            for i in range(4)
        ]
        for request in requests:
            engine.add(request)
        while engine.has_work:
            engine.step()
        outputs.append([(r.output_ids, r.accept_lengths) for r in requests])
    assert outputs[0] == outputs[1]


@torch.inference_mode()
def test_triton_attention_matches_the_dense_mask_and_reads_only_the_used_keys() -> None:
    """The split-KV Triton attention (``TargetModel.attention == "triton"``; run by Triton's
    CPU interpreter here) computes what SDPA with the dense mask computes, on the padded
    layout and on the packed path's grouped queries, with one split per row and with many; and
    each row stops at its last position: NaN keys and values past it (cache slots a row never
    wrote) leave its output finite and unchanged."""
    from engines.embedded import decode_attention
    from engines.embedded.layers import KeyPositions, attention_mask, cached_attention
    from engines.embedded.ragged import ragged_index

    gen = torch.Generator().manual_seed(5)
    batch, width, heads, kv_heads, dim = 3, 4, 8, 2, 16
    keys = 3 * decode_attention.BLOCK_N + 40  # not a multiple of the key block
    q = torch.randn(batch, width, heads, dim, generator=gen)
    k_cache, v_cache = (torch.randn(batch, kv_heads, keys, dim, generator=gen) for _ in "kv")
    starts = torch.tensor([[5], [decode_attention.BLOCK_N + 70], [keys - width]])
    positions = starts + torch.arange(width)
    visible = torch.arange(keys)[None, None, :] <= positions[:, :, None]
    want = cached_attention(q, k_cache, v_cache, attention_mask(visible, heads, kv_heads))
    for row in (0, 1):  # garbage past the row's last position
        k_cache[row, :, int(positions[row, -1]) + 1 :] = float("nan")
        v_cache[row, :, int(positions[row, -1]) + 1 :] = float("nan")
    assert decode_attention.num_splits(batch, kv_heads, keys) == 4  # every key block its own
    got = cached_attention(q, k_cache, v_cache, KeyPositions(positions))  # 4 splits, merged
    assert got.isfinite().all()
    torch.testing.assert_close(got, want)
    group = heads // kv_heads
    grouped_q = q.view(batch, width, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
    grouped_q = grouped_q.reshape(batch, kv_heads, group * width, dim)
    one = decode_attention.grouped_decode_attention(grouped_q, k_cache, v_cache, positions, 1)
    one = one.view(batch, kv_heads, group, width, dim).permute(0, 3, 1, 2, 4)
    torch.testing.assert_close(one.reshape(batch, width, -1), want)  # one split, written directly
    for most in (2, 3):  # the split count is a runtime argument: one kernel for every count > 1
        some = decode_attention.grouped_decode_attention(
            grouped_q, k_cache, v_cache, positions, most
        )
        some = some.view(batch, kv_heads, group, width, dim).permute(0, 3, 1, 2, 4)
        torch.testing.assert_close(some.reshape(batch, width, -1), want)
    # The packed path: queries scattered into the grouped layout, outputs gathered back.
    lengths = [2, 4, 1]
    index = ragged_index(lengths, batch, width, num_tokens=9)
    packing = Packing.from_indices((batch, width), index[0], index[1])
    grouped = packing.grouped_queries(packing.pack(q), kv_heads)
    got = packing.packed_output(
        decode_attention.grouped_decode_attention(grouped, k_cache, v_cache, positions), heads
    )
    used = sum(lengths)
    torch.testing.assert_close(got[:, :used], packing.pack(want)[:, :used])
    # In place (a ragged step's Triton path): queries read and outputs written at their packed
    # tokens (a strided view is fine), with many splits and with one; a row's columns without a
    # token bound no keys (NaN past row 0's second position is never read); a bucket's padding
    # tokens get zeros.
    tokens = packing.token_map()
    assert (tokens >= 0).tolist() == [[c < n for c in range(width)] for n in lengths]
    assert sorted(tokens[tokens >= 0].tolist()) == list(range(used))
    k_cache[0, :, int(positions[0, lengths[0] - 1]) + 1 :] = float("nan")
    v_cache[0, :, int(positions[0, lengths[0] - 1]) + 1 :] = float("nan")
    wide = torch.cat([packing.pack(q)[0], torch.randn(9, 3, dim, generator=gen)], 1)
    for most in (decode_attention.MAX_SPLITS, 1):
        out = decode_attention.packed_decode_attention(
            wide[:, :heads], k_cache, v_cache, positions, tokens, most
        )
        assert out.isfinite().all() and (out[used:] == 0).all()
        torch.testing.assert_close(out.view(1, 9, -1)[:, :used], packing.pack(want)[:, :used])


def test_triton_attention_traces_as_one_graph_as_an_opaque_op() -> None:
    """``torch.compile(fullgraph=True)`` takes the kernel as one custom op (its fake gives the
    output's shape), with dynamic shapes, and the compiled call computes what eager does."""
    from engines.embedded.decode_attention import grouped_decode_attention

    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, 2, 8, 16, generator=gen)
    k, v = (torch.randn(2, 2, 70, 16, generator=gen) for _ in "kv")
    positions = torch.tensor([[30, 31], [60, 61]])
    torch._dynamo.reset()
    compiled = torch.compile(grouped_decode_attention, fullgraph=True, dynamic=True)
    torch.testing.assert_close(
        compiled(q, k, v, positions), grouped_decode_attention(q, k, v, positions)
    )


def test_the_start_up_check_refuses_a_kernel_that_fails_or_disagrees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ModelRunner(attention="triton")`` checks the kernels against SDPA before capture: a
    kernel that cannot run, or that computes something else, stops start-up with a message
    naming the case and the way out (attention: sdpa)."""
    from engines.embedded import layers

    cpu = torch.device("cpu")
    assert layers.check_grouped_attention(8, 2, 16, cpu, torch.float32) < 1e-4

    def wrong(q: torch.Tensor, *args: object) -> torch.Tensor:
        return torch.zeros_like(q)

    def broken(*args: object) -> torch.Tensor:
        raise ValueError("no kernel for this GPU")

    for fake, message in ((wrong, "differs from SDPA by"), (broken, "failed on cpu")):
        monkeypatch.setattr(layers, "grouped_decode_attention", fake)
        with pytest.raises(RuntimeError, match=message) as raised:
            layers.check_grouped_attention(8, 2, 16, cpu, torch.float32)
        assert "use attention: sdpa" in str(raised.value)


def test_auto_attention_takes_triton_on_cuda_only_where_the_start_up_check_passes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``attention: auto`` (the engine's default): sdpa off CUDA without running the check;
    on CUDA, triton when the check passes and sdpa, with the reason logged, when it fails;
    an explicit ``triton`` whose check fails still stops start-up."""
    from types import SimpleNamespace

    from engines.embedded import runner

    shape = SimpleNamespace(num_heads=8, num_kv_heads=2, head_dim=16)
    target: Any = SimpleNamespace(shape=shape)  # choose_attention reads only its head layout
    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # the device is only inspected here
    checked: list[torch.device] = []

    def passes(*args: object) -> float:
        checked.append(args[3])  # type: ignore[arg-type]
        return 0.0

    def fails(*args: object) -> float:
        raise RuntimeError("attention: triton failed on cuda (case); use attention: sdpa")

    monkeypatch.setattr(runner, "check_grouped_attention", passes)
    assert runner.choose_attention("auto", target, cpu, torch.float32) == "sdpa"
    assert runner.choose_attention("sdpa", target, cuda, torch.float32) == "sdpa"
    assert checked == []
    assert runner.choose_attention("auto", target, cuda, torch.bfloat16) == "triton"
    assert runner.choose_attention("triton", target, cuda, torch.bfloat16) == "triton"
    assert checked == [cuda, cuda]
    monkeypatch.setattr(runner, "check_grouped_attention", fails)
    with caplog.at_level("WARNING", logger=runner.__name__):
        assert runner.choose_attention("auto", target, cuda, torch.bfloat16) == "sdpa"
    assert "auto uses sdpa" in caplog.text and "failed on cuda" in caplog.text
    with pytest.raises(RuntimeError, match="use attention: sdpa"):
        runner.choose_attention("triton", target, cuda, torch.bfloat16)


class FakeKernel:
    """Records ``warmup`` calls (what ``compile_ahead`` submits) and launches."""

    def __init__(self, fail: bool = False) -> None:
        self.warmups: list[dict[str, object]] = []
        self.launches = 0
        self.fail = fail

    def warmup(self, *args: object, grid: tuple[int, ...], **kwargs: object) -> None:
        if self.fail:
            raise RuntimeError("ptxas died")
        self.warmups.append(kwargs)

    def __getitem__(self, grid: tuple[int, ...]) -> object:
        def launch(*args: object, **kwargs: object) -> None:
            self.launches += 1

        return launch


def test_compile_ahead_compiles_each_specialisation_once_and_launches_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside ``compile_ahead`` the attention's launches become compile submissions, one per
    specialisation Triton would compile (the split count is a runtime argument, so 2, 3 and
    4 splits share one kernel; one split is another); after it, launches are made again."""
    from engines.embedded import decode_attention

    split, merge = FakeKernel(), FakeKernel()
    monkeypatch.setattr(decode_attention, "_kernels", lambda: (split, merge))
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(2, 2, 4 * decode_attention.BLOCK_N, 16, generator=gen)
    positions = torch.arange(4).repeat(2, 1) + 50
    q = torch.randn(2, 2, 8, 16, generator=gen)
    with decode_attention.compile_ahead(executor=ThreadPoolExecutor(2)) as ahead:
        for most in (4, 3, 2, 1, 4):
            decode_attention.grouped_decode_attention(q, k, k, positions, most)
    assert split.launches == merge.launches == 0
    assert ahead.submitted == 3  # split (many splits), merge, split (one split)
    assert sorted(w["single"] for w in split.warmups) == [False, True]  # type: ignore[type-var]
    assert len(merge.warmups) == 1
    decode_attention.grouped_decode_attention(q, k, k, positions, 4)
    assert split.launches == merge.launches == 1


def test_compile_ahead_logs_a_failed_compile_and_is_not_reentrant(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A compile that fails ahead is logged, not raised (the launch compiles it again and
    raises there); compile_ahead inside compile_ahead is refused."""
    from engines.embedded import decode_attention

    split, merge = FakeKernel(fail=True), FakeKernel(fail=True)
    monkeypatch.setattr(decode_attention, "_kernels", lambda: (split, merge))
    k = torch.zeros(1, 2, 4 * decode_attention.BLOCK_N, 16)
    positions = torch.arange(2)[None] + 9
    with decode_attention.compile_ahead(executor=ThreadPoolExecutor(1)):
        decode_attention.grouped_decode_attention(torch.zeros(1, 2, 4, 16), k, k, positions, 4)
        with pytest.raises(RuntimeError, match="already active"):
            with decode_attention.compile_ahead():
                pass
    assert "compiling a kernel ahead failed" in caplog.text
    assert decode_attention._ahead is None


def test_compile_ahead_sends_workers_dtypes_for_tensors_and_leaves_unaligned_ones_to_the_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a worker process gets is picklable and holds no tensor: each tensor argument
    becomes its dtype (Triton's warmup stands an aligned tensor in for it), and a launch with
    a tensor not 16-byte aligned is not sent (the stand-in would be another specialisation)."""
    from engines.embedded import decode_attention

    sent: list[tuple[object, ...]] = []

    class Recorder(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            sent.append((fn, *args))
            return super().submit(lambda: None)

    split, merge = FakeKernel(), FakeKernel()
    monkeypatch.setattr(decode_attention, "_kernels", lambda: (split, merge))
    k = torch.zeros(2, 2, 4 * decode_attention.BLOCK_N, 16, dtype=torch.bfloat16)
    positions = torch.arange(4).repeat(2, 1) + 50
    q = torch.zeros(2, 2, 8, 16, dtype=torch.bfloat16)
    with decode_attention.compile_ahead(executor=Recorder(1)) as ahead:
        decode_attention.grouped_decode_attention(q, k, k, positions, 4)
        unaligned = torch.zeros(2 * 2 * 8 * 16 + 1, dtype=torch.bfloat16)[1:].view(2, 2, 8, 16)
        decode_attention.grouped_decode_attention(unaligned, k, k, positions, 1)
    assert ahead.submitted == 3 and len(sent) == 2  # split and merge; not the unaligned split
    for fn, source, grid, args, kwargs, device_index in sent:
        module, function, index = source  # type: ignore[misc]
        assert fn is decode_attention.compile_kernel and index in (0, 1)
        assert (module, function) == ("engines.embedded.decode_attention", "_kernels")
        assert device_index is None and isinstance(grid, tuple)
        assert not any(isinstance(arg, torch.Tensor) for arg in args)  # type: ignore[attr-defined]
        assert torch.bfloat16 in args and torch.float32 in args  # type: ignore[operator]
        message = (source, grid, args, kwargs)
        assert pickle.loads(pickle.dumps(message)) == message
    assert [source[2] for _, source, *_ in sent] == [0, 1]  # type: ignore[index]


def test_compile_ahead_takes_the_few_token_linear_kernel_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gemv.launch inside ``compile_ahead`` submits its kernel (once per specialisation: the
    row count is no constant, one token is) and launches nothing; a worker finds it by its
    source (``compile_kernel``)."""
    from engines.embedded import decode_attention, gemv

    sent: list[tuple[object, ...]] = []

    class Recorder(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            sent.append(args)
            return super().submit(lambda: None)

    kernel = FakeKernel()
    monkeypatch.setattr(gemv, "_kernel", lambda: kernel)
    weight = torch.zeros(32, 64)
    with decode_attention.compile_ahead(executor=Recorder(1)) as ahead:
        for rows in (1, 3, 5, 1):
            gemv.launch(torch.zeros(rows, 64), weight, None)
        gemv.launch(torch.zeros(1, 64), weight, None, residual=torch.zeros(1, 32))
    assert ahead.submitted == 3 and kernel.launches == 0  # one token, tiles, one token + add
    assert all(source == ("engines.embedded.gemv", "_kernel", None) for source, *_ in sent)
    source, grid, args, kwargs, device = sent[0]
    decode_attention.compile_kernel(source, grid, args, kwargs, device)  # type: ignore[arg-type]
    assert kernel.warmups[-1]["ONE_ROW"] is True
    gemv.launch(torch.zeros(2, 64), weight, None)
    assert kernel.launches == 1


def test_compile_ahead_compiles_nothing_under_the_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under Triton's interpreter (the tests) compile_ahead starts no worker processes: it
    counts the specialisations and launches nothing."""
    from engines.embedded import decode_attention

    split, merge = FakeKernel(), FakeKernel()
    monkeypatch.setattr(decode_attention, "_kernels", lambda: (split, merge))
    monkeypatch.setattr(decode_attention, "_process_pool", lambda workers: pytest.fail("a pool"))
    assert decode_attention.triton_interpreted()
    k = torch.zeros(1, 2, 4 * decode_attention.BLOCK_N, 16)
    with decode_attention.compile_ahead() as ahead:
        decode_attention.grouped_decode_attention(
            torch.zeros(1, 2, 4, 16), k, k, torch.arange(2)[None] + 9, 4
        )
    assert ahead.submitted == 2 and split.warmups == merge.warmups == []
    assert split.launches == merge.launches == 0


def test_compile_ahead_without_worker_processes_counts_and_launches_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where no worker pool can start (outside the interpreter), compile_ahead logs it and
    only counts: the launches after the pass compile their kernels as without it."""
    from engines.embedded import decode_attention

    def no_pool(workers: int) -> None:
        raise OSError("spawn refused")

    split, merge = FakeKernel(), FakeKernel()
    monkeypatch.setattr(decode_attention, "_kernels", lambda: (split, merge))
    monkeypatch.setattr(decode_attention, "triton_interpreted", lambda: False)
    monkeypatch.setattr(decode_attention, "_process_pool", no_pool)
    k = torch.zeros(1, 2, 4 * decode_attention.BLOCK_N, 16)
    with decode_attention.compile_ahead() as ahead:
        decode_attention.grouped_decode_attention(
            torch.zeros(1, 2, 4, 16), k, k, torch.arange(2)[None] + 9, 4
        )
    assert "no worker processes to compile the attention ahead" in caplog.text
    assert ahead.submitted == 2 and split.warmups == merge.warmups == []
    assert split.launches == merge.launches == 0


def test_a_triton_graph_runner_compiles_its_attention_ahead_and_steps_the_same(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """``ModelRunner(attention="triton")`` with graphs runs one forward per verify shape with
    the attention's launches compiled ahead (the interpreter compiles nothing) before it
    captures; its steps emit what a runner built without that pass emits."""
    from engines.embedded.ragged import ragged_index
    from engines.embedded.runner import ModelRunner

    def build(ahead: bool) -> ModelRunner:
        runner = load_runner(
            *agreeing_pair,
            torch.device("cpu"),
            4,
            64,
            use_cuda_graphs=True,
            verify_mode="ragged",
            attention="triton",
            compile_attention_ahead=ahead,
        )
        assert (runner.attention_compiled_ahead > 0) == ahead
        assert ("attention_ahead" in runner.capture_parts_s) == ahead
        return runner

    outputs = []
    for ahead in (True, False):
        runner = build(ahead)
        for cache in (runner.target_cache, runner.draft_cache):  # the pass wrote scratch
            cache.k.zero_()
            cache.v.zero_()
        ids = torch.randint(0, 256, (4, 8), generator=torch.Generator().manual_seed(1))
        positions = torch.tensor([[3], [9], [5], [2]]) + torch.arange(8)
        index = ragged_index([3, 1, 8, 2], 4, 8, 16)
        outputs.append(runner._ragged_graphs[4, 8, 16](ids, positions, index.clone()).clone())
    valid = torch.arange(8)[None, :] < torch.tensor([3, 1, 8, 2])[:, None]
    torch.testing.assert_close(outputs[0][valid], outputs[1][valid])


def test_a_compile_worker_defines_every_kernel_it_may_be_sent() -> None:
    """``_prepare_worker`` defines the attention's kernels and the few-token linear kernel,
    the sources ``compile_kernel`` resolves (gemv's by name: it imports decode_attention)."""
    from engines.embedded import decode_attention, gemv

    decode_attention._prepare_worker()
    assert ("engines.embedded.gemv", "_kernel") in decode_attention.WORKER_KERNELS
    assert gemv._kernel.cache_info().currsize == 1  # type: ignore[attr-defined]
