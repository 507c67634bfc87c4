"""Linear layers of a few tokens, as one Triton kernel that streams the weights once.

A decode step at batch 1 multiplies one token (or a verify's 16) by every weight matrix, so it
is bound by reading the weights: on the H200 8B shape the GEMMs alone took 4.23 ms against a
3.54 ms read floor (~83% of the measured copy bandwidth, eager cuBLAS; README, "Plain decode
against the weight-read floor"), and inductor's max-autotune, whose Triton templates beat
cuBLAS at M = 1, took the compiled forward from 1.38x to 1.27x the floor but needs minutes of
benchmarking at a first start and loses at batch 8 (tuned for the dynamic graphs' sizes).

``small_linear`` is ``F.linear`` for inputs of at most ``MAX_ROWS`` tokens: each program owns
``BLOCK_N`` output features, reads their weight rows once in ``BLOCK_K`` slices (pipelined
loads) and multiplies them with every token at once (``tl.dot`` on a 16-row tile: the tokens
are padded to 16, as tensor cores want; fp32 accumulation). Its block sizes are chosen per
(N, K, rows) by Triton's autotuner at the first launch of each shape (a graph's warm-up, never
a capture): ~10 ms of timing per configuration and shape, kept in Triton's on-disk cache for a
restart, and one compile per configuration (the row count, sizes and strides do not make new
binaries), not minutes.

``linear`` is the engine's entry: the custom op ``draftctl::small_linear`` (opaque to
``torch.compile``, like the attention, so a compiled layer step keeps one graph whatever the
token count) for CUDA tensors (or the CPU under ``TRITON_INTERPRET=1``: tests) in 16- or 32-bit
floats, else ``F.linear``; inside the op, more than ``MAX_ROWS`` tokens go to ``F.linear``.
The decoder layers and the LM head call it when their ``gemv`` is set (``ModelRunner(linear=
"gemv")``; off by default until measured on the GPU: ``bench/gemv_gpu.py``,
``bench/decode_gpu.py --linear``).
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

from engines.embedded.decode_attention import triton_interpreted

MAX_ROWS = 16  # tokens one program multiplies at once (one tensor-core tile of rows)
# Block sizes the autotuner picks from at the first launch per (N, K, rows): (BLOCK_N,
# BLOCK_K, warps, pipeline stages). Narrow blocks of output features give a small N (4096)
# enough programs to fill the GPU's 132 SMs; deep K slices and stages keep loads in flight.
# Blocks under 16 features serve one-token steps only (the one-row path multiplies without
# tensor cores, whose tiles are 16 wide; ``_prune``).
CONFIGS = (
    (16, 256, 4, 4),
    (16, 512, 4, 3),
    (32, 256, 4, 4),
    (32, 512, 8, 3),
    (64, 128, 4, 5),
    (64, 256, 8, 4),
    (16, 128, 2, 6),
    (128, 128, 8, 4),
    (4, 512, 2, 4),
    (8, 512, 4, 4),
    (8, 1024, 4, 3),
)
INTERPRETED_CONFIG = (16, 32, 1, 1)  # the CPU interpreter: small blocks, no timing


@cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    # The row counts are plain arguments: one binary per block configuration serves every
    # token count (and every matrix, whose sizes and strides are all multiples of 16); only
    # one token or more is a constant (``ONE_ROW``).
    @triton.jit(do_not_specialize=["rows", "rows_bucket"])
    def small_linear_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        rows,
        N,
        K,
        stride_xm,
        stride_wn,
        stride_ym,
        rows_bucket,  # autotuning key only: the row count rounded up (1, 2, 4, 8, 16)
        HAS_BIAS: tl.constexpr,
        ONE_ROW: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = rn < N
        if ONE_ROW:  # one token: multiply-add and a sum over K, any BLOCK_N
            acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                k_mask = rk < K
                w = tl.load(
                    w_ptr + rn[:, None] * stride_wn + rk[None, :],
                    mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                x1 = tl.load(x_ptr + rk, mask=k_mask, other=0.0)
                acc1 += tl.sum(w.to(tl.float32) * x1.to(tl.float32)[None, :], axis=1)
            if HAS_BIAS:
                acc1 += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
            tl.store(y_ptr + rn, acc1.to(y_ptr.dtype.element_ty), mask=n_mask)
        else:  # up to 16 tokens: one tensor-core tile of rows (padded with zeros)
            rm = tl.arange(0, 16)
            m_mask = rm < rows
            acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                k_mask = rk < K
                w = tl.load(
                    w_ptr + rn[:, None] * stride_wn + rk[None, :],
                    mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                x = tl.load(
                    x_ptr + rm[:, None] * stride_xm + rk[None, :],
                    mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                acc += tl.dot(x, tl.trans(w))
            if HAS_BIAS:
                acc += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(
                y_ptr + rm[:, None] * stride_ym + rn[None, :],
                acc.to(y_ptr.dtype.element_ty),
                mask=m_mask[:, None] & n_mask[None, :],
            )

    if triton_interpreted():
        return small_linear_kernel
    configs = [
        triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=warps, num_stages=stages)
        for n, k, warps, stages in CONFIGS
    ]
    # The quick timing and the on-disk cache where this Triton has them (3.x releases differ).
    accepted = inspect.signature(triton.autotune).parameters
    options = {"do_bench": _quick_bench, "cache_results": True}
    return triton.autotune(
        configs,
        key=["N", "K", "rows_bucket"],
        prune_configs_by={"early_config_prune": _prune},
        **{name: value for name, value in options.items() if name in accepted},
    )(small_linear_kernel)


def _prune(configs: list[Any], named_args: dict[str, Any], **kwargs: Any) -> list[Any]:
    """Blocks under 16 output features only for one-token steps (``CONFIGS``)."""
    if named_args["rows_bucket"] == 1:
        return configs
    return [c for c in configs if c.kwargs["BLOCK_N"] >= 16]


def _quick_bench(kernel_call: Any, quantiles: Any) -> Any:
    """The autotuner's timing of one configuration: ~10 ms of calls (Triton's default is
    ~125 ms, which over ~24 keys and 11 configurations would add half a minute to a start)."""
    import triton.testing

    return triton.testing.do_bench(kernel_call, warmup=1, rep=10, quantiles=quantiles)


def rows_bucket(rows: int) -> int:
    """The autotuning key's row count: ``rows`` rounded up to 1, 2, 4, 8 or 16."""
    return 1 << max(0, (rows - 1).bit_length())


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """The kernel on x [rows <= MAX_ROWS, K] (contiguous rows): out [rows, N]. ``config``
    (BLOCK_N, BLOCK_K, warps, stages) instead of the autotuner's choice (benchmarks, tests;
    the interpreter always runs one: ``INTERPRETED_CONFIG`` by default)."""
    kernel = _kernel()
    rows, k = x.shape
    n = weight.shape[0]
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    out = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    strides = (x.stride(0), weight.stride(0), out.stride(0))
    args = (x, weight, x if bias is None else bias, out, rows, n, k, *strides, rows_bucket(rows))
    flags = {"HAS_BIAS": bias is not None, "ONE_ROW": rows == 1}
    if config is None and triton_interpreted():
        config = INTERPRETED_CONFIG
    if config is None:

        def grid(meta: dict[str, int]) -> tuple[int]:
            return (-(-n // meta["BLOCK_N"]),)

        kernel[grid](*args, **flags)
        return out
    block_n, block_k, warps, stages = config
    if rows > 1 and block_n < 16:
        raise ValueError(f"BLOCK_N {block_n} serves one token only; {rows} need 16 or more")
    # An autotuned kernel runs one configuration through the jitted function it wraps.
    plain = kernel.fn if hasattr(kernel, "configs") else kernel
    plain[(-(-n // block_n),)](
        *args, **flags, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages
    )
    return out


@torch.library.custom_op("draftctl::small_linear", mutates_args=())
def small_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: the Triton kernel for x [..., K] of at most
    ``MAX_ROWS`` tokens, ``F.linear`` itself for more (decided here, at run time, so that a
    compiled step traces no test of its token count)."""
    k = x.shape[-1]
    n = weight.shape[0]
    flat = x.reshape(-1, k)
    rows = flat.shape[0]
    if rows > MAX_ROWS or rows == 0:
        return F.linear(x, weight, bias)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    return launch(flat, weight, bias).reshape(*x.shape[:-1], n)


@small_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def takes(x: torch.Tensor) -> bool:
    """Whether ``small_linear`` can run ``x``: floats on CUDA (or under the interpreter).
    Static properties only: the token count is tested inside the op."""
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    return x.device.type == "cuda" or triton_interpreted()


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gemv: bool = False
) -> torch.Tensor:
    """``F.linear``, through ``small_linear`` when ``gemv`` and it ``takes`` x (a step of
    more than ``MAX_ROWS`` tokens then runs ``F.linear`` inside the op)."""
    if gemv and takes(x):
        return small_linear(x, weight, bias)
    return F.linear(x, weight, bias)
