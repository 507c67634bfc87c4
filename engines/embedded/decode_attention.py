"""Split-KV attention for verify and decode steps (a Triton kernel pair; ``attention: triton``).

The engine's steps attend a few query columns per row (``W`` = k + 1 ≤ block size) to that
row's KV cache. PyTorch SDPA with a dense ``[B, group × W, keys]`` mask reads every key of the
cache the graph was captured with (the whole ``max_seq_len``), and its flash kernels tile the
grouped queries 64 or 128 at a time, so a row and KV head get one thread block: at batch 1
eight blocks walk 768 keys each (0.70 ms of a 7.5 ms 8B decode step on the H200,
``bench/results/step_breakdown_h200_2026-12-02.json``; 0.14 ms per layer at 64 rows × 16).

Here (flash-decoding): program (row, kv head, split) attends all ``group × W`` grouped queries
of that row and head to one slice of the keys, stopping at the row's largest position (keys
past it are never read), with an online softmax; a second kernel merges the splits (with one
split the program normalises and writes the output itself). Splits are chosen from the static
shapes so that small batches still fill the GPU; splits past a row's position exit at once.
The mask is the engine's: key j is visible to column c of row b iff ``j <= positions[b, c]``.

Triton compiles a kernel once per set of ``tl.constexpr`` values (and integer-argument
classes) at its first launch, on the host. The split count varies with the batch size, so it
is a runtime argument (``do_not_specialize``; only "one split or more" is a constant): as a
constant it made every batch bucket its own kernel, 62 compiles of ~0.57 s each, 35 s of a
99 s first start on the H200 8B shape (``bench/results/first_start_h200_2026-12-04s25.json``,
``triton_jit``); 21 compiles remain (one per width, layout and "one split or more",
session 26). They run ahead of the captures in worker processes (``compile_ahead``; the
runner's ``compile_attention_ahead``, on by default on a CUDA device since session 27): the
runner runs each graph's forward once with the launches collected instead of made, each new
specialisation is compiled by a worker into Triton's on-disk cache, and the runner waits for
the workers before it captures, whose launches then load the kernels from that cache. Threads
did not help: on the H200 a thread pool's compiles took as long as compiling at each launch
(session 26, ``bench/results/first_start_h200_2026-12-04s26a_threads.json``: Triton's compiler
holds the GIL and competes with the main thread's torch.compile). Processes take the compiles
off the main thread (10-13 s to 3-5 s): with one warm-up per graph, three paired first starts
on one machine 6-12 s faster; on a faster machine the two changes together 2.2 s faster than
neither, inside that call's spread
(``bench/results/first_start_h200_2026-12-04s27{b_ahead,c_defaults}.json``).

``grouped_decode_attention`` is a ``torch.library`` custom op: opaque to ``torch.compile``
(dynamic shapes need no lowering of it) and capturable in CUDA graphs (no host sync; the
partial buffers come from the graph's pool). Triton is imported on first use, so CPU-only
installs never need it; tests run the kernels on the CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from functools import cache
from typing import Any

import torch

logger = logging.getLogger(__name__)

BLOCK_N = 64  # keys per inner step
TARGET_PROGRAMS = 264  # splits are chosen to launch about this many programs (2 per H200 SM)
MAX_SPLITS = 16
# Grouped queries (group x W) one program holds: the engine's steps (W <= block size) fit;
# prefills, whose W is a prompt, keep SDPA (TargetModel.forward).
MAX_GROUPED_QUERIES = 128


def triton_interpreted() -> bool:
    """Whether Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``: tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def num_splits(batch: int, kv_heads: int, num_keys: int, most: int = MAX_SPLITS) -> int:
    """Key splits per (row, kv head): enough programs to fill the device at small batches,
    one at large ones, never more splits than key blocks (nor than ``most``)."""
    blocks = max(1, -(-num_keys // BLOCK_N))
    wanted = max(1, -(-TARGET_PROGRAMS // (batch * kv_heads)))
    return min(wanted, blocks, most)


@cache
def _kernels() -> tuple[Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["splits"])
    def split_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        pos_ptr,
        tok_ptr,
        o_ptr,
        ml_ptr,
        out_ptr,
        sqb,
        sqh,
        sqm,
        sob,
        soh,
        som,
        skb,
        skh,
        skn,
        svb,
        svh,
        svn,
        spb,
        stb,
        num_keys,
        keys_per_split,
        scale,
        splits,
        kv_heads: tl.constexpr,
        num_queries: tl.constexpr,
        width: tl.constexpr,
        single: tl.constexpr,
        head_dim: tl.constexpr,
        block_m: tl.constexpr,
        block_w: tl.constexpr,
        block_n: tl.constexpr,
        packed: tl.constexpr,
    ):
        bh = tl.program_id(0)
        split = tl.program_id(1)
        # 64-bit row offsets: a long cache times many slots passes 2**31 elements.
        b = (bh // kv_heads).to(tl.int64)
        h = bh % kv_heads
        offs_m = tl.arange(0, block_m)
        offs_d = tl.arange(0, head_dim)
        offs_w = tl.arange(0, block_w)
        valid_m = offs_m < num_queries
        # Each grouped query m is column m % width of the row.
        used_w = offs_w < width
        if packed:  # only the columns holding a token bound the keys read
            used_w = used_w & (tl.load(tok_ptr + b * stb + offs_w, mask=used_w, other=-1) >= 0)
        row_pos = tl.load(pos_ptr + b * spb + offs_w, mask=used_w, other=-1)
        last = tl.max(row_pos, axis=0).to(tl.int32)
        pos_m = tl.load(pos_ptr + b * spb + (offs_m % width), mask=valid_m, other=-1)
        pos_m = pos_m.to(tl.int32)
        start = split * keys_per_split
        stop = tl.minimum(tl.minimum(start + keys_per_split, num_keys), last + 1)
        if packed:  # q [N, heads, D]: grouped query m is head h * group + m // width of the
            # packed token tokens[b, m % width] (-1: the row has no token in that column)
            token = tl.load(tok_ptr + b * stb + (offs_m % width), mask=valid_m, other=-1)
            valid_m = valid_m & (token >= 0)
            head = h * (num_queries // width) + offs_m // width
            rows = token.to(tl.int64) * sqb + head * sqh
            out_rows = token.to(tl.int64) * sob + head * soh
        else:
            rows = b * sqb + h * sqh + offs_m * sqm
            out_rows = b * sob + h * soh + offs_m * som
        q = tl.load(q_ptr + rows[:, None] + offs_d[None, :], mask=valid_m[:, None], other=0.0)
        m_i = tl.full([block_m], float("-inf"), tl.float32)
        l_i = tl.zeros([block_m], tl.float32)
        acc = tl.zeros([block_m, head_dim], tl.float32)
        for n0 in range(start, stop, block_n):
            offs_n = n0 + tl.arange(0, block_n)
            in_range = offs_n < stop
            k = tl.load(
                k_ptr + b * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :],
                mask=in_range[:, None],
                other=0.0,
            )
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            visible = in_range[None, :] & (offs_n[None, :] <= pos_m[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(
                v_ptr + b * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :],
                mask=in_range[:, None],
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        if single:  # the whole row in this program (one split): normalise and write
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(
                out_ptr + out_rows[:, None] + offs_d[None, :],
                out.to(out_ptr.dtype.element_ty),
                mask=valid_m[:, None],
            )
        else:
            part = (bh * splits + split) * block_m
            tl.store(o_ptr + (part + offs_m[:, None]) * head_dim + offs_d[None, :], acc)
            tl.store(ml_ptr + (part + offs_m) * 2, m_i)
            tl.store(ml_ptr + (part + offs_m) * 2 + 1, l_i)

    @triton.jit(do_not_specialize=["splits"])
    def merge_kernel(
        o_ptr,
        ml_ptr,
        out_ptr,
        tok_ptr,
        sob,
        soh,
        som,
        stb,
        splits,
        kv_heads: tl.constexpr,
        num_queries: tl.constexpr,
        width: tl.constexpr,
        head_dim: tl.constexpr,
        block_m: tl.constexpr,
        packed: tl.constexpr,
    ):
        bh = tl.program_id(0)
        b = (bh // kv_heads).to(tl.int64)
        h = bh % kv_heads
        offs_m = tl.arange(0, block_m)
        offs_d = tl.arange(0, head_dim)
        m_max = tl.full([block_m], float("-inf"), tl.float32)
        for split in range(splits):
            part = (bh * splits + split) * block_m
            m_max = tl.maximum(m_max, tl.load(ml_ptr + (part + offs_m) * 2))
        m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
        total = tl.zeros([block_m], tl.float32)
        acc = tl.zeros([block_m, head_dim], tl.float32)
        for split in range(splits):
            part = (bh * splits + split) * block_m
            weight = tl.exp(tl.load(ml_ptr + (part + offs_m) * 2) - m_safe)
            total += weight * tl.load(ml_ptr + (part + offs_m) * 2 + 1)
            o = tl.load(o_ptr + (part + offs_m[:, None]) * head_dim + offs_d[None, :])
            acc += weight[:, None] * o
        out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        valid_m = offs_m < num_queries
        if packed:  # the split kernel's layout: see there
            token = tl.load(tok_ptr + b * stb + (offs_m % width), mask=valid_m, other=-1)
            valid_m = valid_m & (token >= 0)
            head = h * (num_queries // width) + offs_m // width
            out_rows = token.to(tl.int64) * sob + head * soh
        else:
            out_rows = b * sob + h * soh + offs_m * som
        tl.store(
            out_ptr + out_rows[:, None] + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=valid_m[:, None],
        )

    return split_kernel, merge_kernel


def _argument_class(value: object) -> object:
    """What Triton specialises an argument on (tensors: dtype and 16-byte alignment; ints:
    equal to 1, divisible by 16, 64-bit), so that launches it would compile once are
    submitted once."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return (value == 1, value % 16 == 0, not -(2**31) <= value < 2**31)
    return type(value).__name__


def _compile_spec(arg: object) -> object:
    """What a worker process needs of a launch argument to compile the same specialisation:
    a tensor becomes its dtype (Triton's ``warmup`` stands a 16-byte-aligned tensor in for
    it), other values stay; None for a tensor that is not 16-byte aligned (its launch
    compiles it: the stand-in would be another specialisation)."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype if arg.data_ptr() % 16 == 0 else None
    return arg


# Where a worker finds a kernel: (module, function returning it or a tuple of kernels, index
# into that tuple or None).
KernelSource = tuple[str, str, int | None]


def compile_kernel(
    source: KernelSource,
    grid: tuple[int, ...],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    device_index: int | None,
) -> None:
    """Compiles the kernel at ``source`` for these arguments (``_compile_spec``'s) into
    Triton's on-disk cache, launching nothing: what a ``compile_ahead`` worker process runs."""
    module, function, index = source
    found = getattr(importlib.import_module(module), function)()
    kernel = found if index is None else found[index]
    with torch.cuda.device(device_index) if device_index is not None else contextlib.nullcontext():
        kernel.warmup(*args, grid=grid, **kwargs)


# The kernels a worker defines before its first submission: this module's, and the few-token
# linear kernel's (by name: engines.embedded.gemv imports this module).
WORKER_KERNELS: tuple[tuple[str, str], ...] = (
    (__name__, "_kernels"),
    ("engines.embedded.gemv", "_kernel"),
)


def _prepare_worker() -> None:
    """Imports Triton and defines the kernels in a fresh worker, so that its start-up overlaps
    the parent's first forwards rather than following its first submission."""
    for module, function in WORKER_KERNELS:
        getattr(importlib.import_module(module), function)()


def _process_pool(workers: int) -> Executor:
    # spawn: the parent has CUDA initialised, which a forked child cannot use.
    workers = max(1, workers)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    for _ in range(workers):  # each submission to a pool with no idle worker starts one
        pool.submit(_prepare_worker)
    return pool


class CompilesAhead:
    """While active (``compile_ahead``), ``_launch`` hands its kernels here instead of
    launching them (the outputs are left unset): each new specialisation is compiled by
    ``executor`` (``compile_kernel``: Triton's ``warmup``, the same binder and on-disk cache
    as a launch, so the launch that follows loads it). ``executor`` None: the
    specialisations are counted, nothing is compiled (Triton's interpreter)."""

    def __init__(self, executor: Executor | None) -> None:
        self._executor = executor
        self._seen: set[tuple[object, ...]] = set()
        self._futures: list[Future[None]] = []
        self.waited_s = 0.0  # how long ``wait`` waited for the compiles

    @property
    def submitted(self) -> int:
        """Specialisations submitted (each compiled once)."""
        return len(self._seen)

    def submit(
        self,
        kernel: Any,
        grid: tuple[int, ...],
        args: tuple[object, ...],
        kwargs: dict[str, object],
        device: torch.device,
        source: KernelSource | None = None,
    ) -> None:
        """``source``: where a worker finds ``kernel`` (default: the attention's kernels)."""
        key = (id(kernel), *map(_argument_class, args), *sorted(kwargs.items()))
        if key in self._seen:
            return
        self._seen.add(key)
        specs = tuple(map(_compile_spec, args))
        if self._executor is None or any(spec is None for spec in specs):
            return
        if source is None:
            source = (__name__, "_kernels", _kernels().index(kernel))
        device_index = device.index if device.type == "cuda" else None
        try:
            future = self._executor.submit(
                compile_kernel, source, grid, specs, kwargs, device_index
            )
        except Exception as exc:  # a broken pool: the launches compile instead
            logger.warning("compiling a kernel ahead failed: %r", exc)
            return
        self._futures.append(future)

    def wait(self) -> int:
        """Wait for every compile; returns how many failed (each was logged; its launch will
        compile it again, and raise there if it fails again)."""
        failed = 0
        started = time.perf_counter()
        for future in self._futures:
            try:
                future.result()
            except Exception as exc:
                failed += 1
                logger.warning("compiling a kernel ahead failed: %r", exc)
        if self._executor is not None:
            self._executor.shutdown()
        self.waited_s = time.perf_counter() - started
        return failed


_ahead: CompilesAhead | None = None


def compiling_ahead() -> CompilesAhead | None:
    """The active ``compile_ahead``'s collector, or None: other kernels' launches
    (gemv.launch) submit to it as the attention's do."""
    return _ahead


@contextlib.contextmanager
def compile_ahead(
    workers: int | None = None, executor: Executor | None = None
) -> Iterator[CompilesAhead]:
    """Inside: the attention kernels are not launched (their outputs are left unset) but
    compiled by ``executor`` (default: ``workers`` spawned processes, by default half the
    CPUs and at most 8; none under Triton's interpreter, which compiles nothing) for every
    specialisation the launches need; on exit, waits for them. One at a time (not
    reentrant); for a start-up pass whose outputs are thrown away."""
    global _ahead
    if _ahead is not None:
        raise RuntimeError("compile_ahead is already active")
    if executor is None and not triton_interpreted():
        if workers is None:
            workers = min(8, max(1, (os.cpu_count() or 2) // 2))
        try:
            executor = _process_pool(workers)
        except Exception as exc:  # no worker processes here: the launches compile instead
            logger.warning("no worker processes to compile the attention ahead: %r", exc)
    ahead = _ahead = CompilesAhead(executor)
    try:
        yield ahead
    finally:
        _ahead = None
        ahead.wait()


def _next_pow2(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, (n - 1).bit_length()))


def _launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    tokens: torch.Tensor | None,
    out: torch.Tensor,
    num_queries: int,
    max_splits: int,
) -> None:
    """Both layouts' launches. Grouped (``tokens`` None): q and out [B, kv_heads, group × W,
    D]. Packed: q and out [N, heads, D], ``tokens`` [B, W] the packed index of row b's column
    c (-1: none)."""
    split_kernel, merge_kernel = _kernels()
    batch, kv_heads, num_keys, head_dim = k_cache.shape
    width = positions.shape[1]
    if q.stride(-1) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("grouped_decode_attention needs a contiguous head_dim")
    splits = num_splits(batch, kv_heads, num_keys, max_splits)
    per_split = -(-num_keys // splits)
    keys_per_split = -(-per_split // BLOCK_N) * BLOCK_N  # whole key blocks per split
    block_m = _next_pow2(num_queries, 16)
    positions = positions.contiguous()
    packed = tokens is not None
    tokens = positions if tokens is None else tokens.contiguous()  # unread when not packed
    # Grouped: (row, kv head, query) strides; packed: (token, head, unused).
    q_strides = (q.stride(0), q.stride(1), 0 if packed else q.stride(2))
    out_strides = (out.stride(0), out.stride(1), 0 if packed else out.stride(2))
    # Partial outputs and (max, sum) per split; one split writes the output directly.
    rows = batch * kv_heads * splits * block_m if splits > 1 else 1
    partial = torch.empty(rows, head_dim, device=q.device, dtype=torch.float32)
    stats = torch.empty(rows, 2, device=q.device, dtype=torch.float32)
    split_args = (
        q,
        k_cache,
        v_cache,
        positions,
        tokens,
        partial,
        stats,
        out,
        *q_strides,
        *out_strides,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        positions.stride(0),
        tokens.stride(0),
        num_keys,
        keys_per_split,
        1.0 / math.sqrt(head_dim),
        splits,
    )
    split_kwargs: dict[str, object] = {
        "kv_heads": kv_heads,
        "num_queries": num_queries,
        "width": width,
        "single": splits == 1,
        "head_dim": head_dim,
        "block_m": block_m,
        "block_w": _next_pow2(width, 1),
        "block_n": BLOCK_N,
        "packed": packed,
        # 128 grouped queries (a 32B-shape step at W 16) hold a 128 x head_dim accumulator:
        # twice the warps keep it in registers.
        "num_warps": 8 if block_m >= 128 else 4,
    }
    merge_args = (partial, stats, out, tokens, *out_strides, tokens.stride(0), splits)
    merge_kwargs: dict[str, object] = {
        "kv_heads": kv_heads,
        "num_queries": num_queries,
        "width": width,
        "head_dim": head_dim,
        "block_m": block_m,
        "packed": packed,
    }
    launches: list[tuple[Any, tuple[int, ...], tuple[object, ...], dict[str, object]]] = [
        (split_kernel, (batch * kv_heads, splits), split_args, split_kwargs)
    ]
    if splits > 1:
        launches.append((merge_kernel, (batch * kv_heads,), merge_args, merge_kwargs))
    for kernel, grid, args, kwargs in launches:
        if _ahead is not None:
            _ahead.submit(kernel, grid, args, kwargs, q.device)
        else:
            kernel[grid](*args, **kwargs)


@torch.library.custom_op("draftctl::grouped_decode_attention", mutates_args=())
def grouped_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    max_splits: int = MAX_SPLITS,
) -> torch.Tensor:
    """q: grouped queries [B, kv_heads, group × W, D]; k/v_cache [B, kv_heads, keys, D] (any
    batch and head strides, contiguous head_dim); positions [B, W]. Returns [B, kv_heads,
    group × W, D] like ``layers.grouped_attention`` with the engine's causal mask.
    ``max_splits``: at most this many key splits per row and head (1: one program per row and
    head, which normalises and writes the output itself)."""
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    _launch(q, k_cache, v_cache, positions, None, out, q.shape[2], max_splits)
    return out


@torch.library.custom_op("draftctl::packed_decode_attention", mutates_args=())
def packed_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    tokens: torch.Tensor,
    max_splits: int = MAX_SPLITS,
) -> torch.Tensor:
    """The same attention for a ragged step's packed tokens, with no layout copies: q [N,
    heads, D] (any token and head strides, contiguous head_dim), positions [B, W] and
    ``tokens`` [B, W] (the packed index of row b's column c, -1 where the row has none;
    ``Packing.token_map``). Returns [N, heads, D]; tokens of no row (a bucket's padding) get
    zeros."""
    out = torch.zeros(q.shape, device=q.device, dtype=q.dtype)
    group = q.shape[1] // k_cache.shape[1]
    _launch(q, k_cache, v_cache, positions, tokens, out, group * positions.shape[1], max_splits)
    return out


@packed_decode_attention.register_fake
def _fake_packed(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    tokens: torch.Tensor,
    max_splits: int = MAX_SPLITS,
) -> torch.Tensor:
    return torch.empty(q.shape, device=q.device, dtype=q.dtype)


@grouped_decode_attention.register_fake
def _(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    max_splits: int = MAX_SPLITS,
) -> torch.Tensor:
    return torch.empty(q.shape, device=q.device, dtype=q.dtype)
