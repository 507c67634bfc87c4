"""Linear layers of a few tokens, as one Triton kernel that streams the weights once, with the
RMSNorm before it, the SiLU gate before the down projection and the residual add after it
folded in.

A decode step at batch 1 multiplies one token (or a verify's 16) by every weight matrix, so it
is bound by reading the weights: on the H200 8B shape the GEMMs alone took 4.23 ms against a
3.54 ms read floor (~83% of the measured copy bandwidth, eager cuBLAS; README, "Plain decode
against the weight-read floor"), and inductor's max-autotune, whose Triton templates beat
cuBLAS at M = 1, took the compiled forward from 1.38x to 1.27x the floor but needs minutes of
benchmarking at a first start and loses at batch 8 (tuned for the dynamic graphs' sizes).

``small_linear`` is ``F.linear`` for inputs of at most ``MAX_ROWS`` tokens: each program owns
``BLOCK_N`` output features, reads their weight rows once in ``BLOCK_K`` slices (pipelined
loads) and multiplies them with every token at once (``tl.dot`` on a 16-row tile: the tokens
are padded to 16, as tensor cores want; fp32 accumulation); one token takes a multiply-add
path without tensor cores, whose narrow blocks give the 4096-wide matrices enough programs.
The block sizes are fixed (``default_config``): timed one by one against the other
``CANDIDATES`` on the H200 8B shape (``bench/gemv_gpu.py --every-config``, sessions 28a and
28d), each was within 8% of the best at every matrix and token count, where the autotuner's
~10 ms timings had picked configurations up to 18% slower and cost one compile per candidate
at a first start.

Three optional parts around the product remove the small kernels between the GEMMs of a
decoder layer (one launch each, at a few tokens a step as long as their work):
- ``norm_weight``: the input is RMS-normalised and scaled first (``RMSNorm``): every program
  reads the whole input row anyway, so it sums its squares on the way and scales its output
  by the row's ``1 / rms`` at the end;
- ``act``: the input is [gate | up] (2K wide) and the product takes ``silu(gate) * up``;
- ``residual``: added to the output.
``reference`` is the same computation in PyTorch ops, the order the unfused layers use.

``linear`` is the engine's entry: the custom op ``draftctl::small_linear`` (opaque to
``torch.compile``, like the attention, so a compiled layer step keeps one graph whatever the
token count) for CUDA tensors (or the CPU under ``TRITON_INTERPRET=1``: tests) in 16- or 32-bit
floats, else ``reference``; inside the op, more than ``MAX_ROWS`` tokens go to ``reference``.
The decoder layers and the LM head call it when their ``gemv`` is set (``ModelRunner(linear=
"gemv")``, the product alone, or ``"fused"``: with the norms, the gate and the residual adds,
for steps of at most ``FUSED_MAX_ROWS`` tokens, the product alone for larger ones).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

from engines.embedded.decode_attention import compiling_ahead, triton_interpreted

MAX_ROWS = 16  # tokens one program multiplies at once (one tensor-core tile of rows)
# (BLOCK_N, BLOCK_K, warps, pipeline stages). One token: 8 output features a program (512
# programs for a 4096-wide matrix: the H200's 132 SMs each get several), and over inputs
# wider than ``WIDE_K`` 1024-wide slices on 8 warps (the down projection 30.7 -> 25.8 us, the
# draft's context projection 49.8 -> 42.4 us; q/k/v, 4096 wide, 13.2 -> 15.3 us: session
# 28d). Several tokens: a 16 x 32 tile of outputs a program, K in 256-wide slices.
ONE_ROW_CONFIG = (8, 512, 4, 4)
ONE_ROW_WIDE_CONFIG = (8, 1024, 8, 4)
WIDE_K = 4096
TILE_CONFIG = (32, 256, 4, 4)
# Every configuration bench/gemv_gpu.py --every-config times (the two above among them).
CANDIDATES = (
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
    # one-token candidates added in session 28 (the down projection reached 3.3 TB/s only)
    (8, 2048, 8, 3),
    (8, 1024, 8, 4),
    (8, 512, 8, 4),
    (8, 256, 2, 6),
    (4, 1024, 4, 4),
    (16, 1024, 8, 3),
)
INTERPRETED_CONFIG = (16, 32, 1, 1)  # the CPU interpreter: small blocks
# The most tokens a step may have for ModelRunner(linear="fused") to fuse its layers' parts
# (``fuses``). One: on the H200 8B shape the parts made the one-token products faster (q/k/v
# with its norm 21.5 -> 14.4 us, gate/up 55.0 -> 48.6, down with the gate and the add 36.1 ->
# 35.2) but the tiles of 2-16 tokens 2-6x slower (session 28b, bench/gemv_gpu.py).
FUSED_MAX_ROWS = 1


@cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    # The row count is a plain argument: one binary per configuration and set of parts
    # serves every token count (and every matrix, whose sizes and strides are all multiples
    # of 16); only one token or more is a constant (``ONE_ROW``).
    @triton.jit(do_not_specialize=["rows"])
    def small_linear_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        g_ptr,  # the RMSNorm's weight [K] (NORM)
        r_ptr,  # the residual [rows, N] (RESIDUAL)
        y_ptr,
        rows,
        N,
        K,
        stride_xm,
        stride_wn,
        stride_rm,
        stride_ym,
        eps,
        HAS_BIAS: tl.constexpr,
        NORM: tl.constexpr,
        ACT: tl.constexpr,
        RESIDUAL: tl.constexpr,
        ONE_ROW: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = rn < N
        dtype = x_ptr.dtype.element_ty
        if ONE_ROW:  # one token: multiply-add and a sum over K, any BLOCK_N
            acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
            squares1 = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                k_mask = rk < K
                w = tl.load(
                    w_ptr + rn[:, None] * stride_wn + rk[None, :],
                    mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                x1 = tl.load(x_ptr + rk, mask=k_mask, other=0.0).to(tl.float32)
                if ACT:  # silu(gate) * up, rounded as the unfused product's input is
                    up1 = tl.load(x_ptr + K + rk, mask=k_mask, other=0.0).to(tl.float32)
                    x1 = (x1 * tl.sigmoid(x1) * up1).to(dtype).to(tl.float32)
                if NORM:
                    squares1 += x1 * x1
                    x1 = x1 * tl.load(g_ptr + rk, mask=k_mask, other=0.0).to(tl.float32)
                acc1 += tl.sum(w.to(tl.float32) * x1[None, :], axis=1)
            if NORM:
                acc1 = acc1 * tl.rsqrt(tl.sum(squares1, axis=0) / K + eps)
            if HAS_BIAS:
                acc1 += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
            if RESIDUAL:
                acc1 += tl.load(r_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
            tl.store(y_ptr + rn, acc1.to(y_ptr.dtype.element_ty), mask=n_mask)
        else:  # up to 16 tokens: one tensor-core tile of rows (padded with zeros)
            rm = tl.arange(0, 16)
            m_mask = rm < rows
            acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
            squares = tl.zeros((16,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                k_mask = rk < K
                w = tl.load(
                    w_ptr + rn[:, None] * stride_wn + rk[None, :],
                    mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                x_mask = m_mask[:, None] & k_mask[None, :]
                x_at = x_ptr + rm[:, None] * stride_xm + rk[None, :]
                x = tl.load(x_at, mask=x_mask, other=0.0)
                if ACT:
                    gate = x.to(tl.float32)
                    up = tl.load(x_at + K, mask=x_mask, other=0.0).to(tl.float32)
                    x = (gate * tl.sigmoid(gate) * up).to(dtype)
                if NORM:
                    xf = x.to(tl.float32)
                    squares += tl.sum(xf * xf, axis=1)
                    norm_w = tl.load(g_ptr + rk, mask=k_mask, other=0.0).to(tl.float32)
                    x = (xf * norm_w[None, :]).to(dtype)
                acc += tl.dot(x, tl.trans(w))
            if NORM:
                acc = acc * tl.rsqrt(squares / K + eps)[:, None]
            if HAS_BIAS:
                acc += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            out_mask = m_mask[:, None] & n_mask[None, :]
            if RESIDUAL:
                r_at = r_ptr + rm[:, None] * stride_rm + rn[None, :]
                acc += tl.load(r_at, mask=out_mask, other=0.0).to(tl.float32)
            tl.store(
                y_ptr + rm[:, None] * stride_ym + rn[None, :],
                acc.to(y_ptr.dtype.element_ty),
                mask=out_mask,
            )

    return small_linear_kernel


def default_config(rows: int, k: int) -> tuple[int, int, int, int]:
    """The block configuration for ``rows`` tokens times a matrix ``k`` inputs wide."""
    if rows > 1:
        return TILE_CONFIG
    return ONE_ROW_WIDE_CONFIG if k > WIDE_K else ONE_ROW_CONFIG


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: tuple[int, int, int, int] | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    act: bool = False,
) -> torch.Tensor:
    """The kernel on x [rows <= MAX_ROWS, K] ([rows, 2K] = [gate | up] with ``act``;
    contiguous rows): out [rows, N], with the parts ``reference`` describes. ``config``
    (BLOCK_N, BLOCK_K, warps, stages): by default ``default_config``'s
    (``INTERPRETED_CONFIG`` under the interpreter); benchmarks and tests pass others."""
    if act and norm_weight is not None:
        raise ValueError("act and norm_weight: one part before the product, not both")
    rows, width = x.shape
    n, k = weight.shape
    if width != (2 * k if act else k):
        raise ValueError(f"x is {width} wide; weight [{n}, {k}] wants {2 * k if act else k}")
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    out = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    if residual is not None:
        residual = residual.reshape(rows, n)
        if residual.stride(1) != 1:
            residual = residual.contiguous()
    if config is None:
        config = INTERPRETED_CONFIG if triton_interpreted() else default_config(rows, k)
    block_n, block_k, warps, stages = config
    if rows > 1 and block_n < 16:
        raise ValueError(f"BLOCK_N {block_n} serves one token only; {rows} need 16 or more")
    grid = (-(-n // block_n),)
    args = (
        x,
        weight,
        x if bias is None else bias,
        x if norm_weight is None else norm_weight,
        x if residual is None else residual,
        out,
        rows,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        0 if residual is None else residual.stride(0),
        out.stride(0),
        eps,
    )
    kwargs: dict[str, object] = {
        "HAS_BIAS": bias is not None,
        "NORM": norm_weight is not None,
        "ACT": act,
        "RESIDUAL": residual is not None,
        "ONE_ROW": rows == 1,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "num_warps": warps,
        "num_stages": stages,
    }
    ahead = compiling_ahead()
    if ahead is not None:  # a start-up pass: compiled in a worker, the output left unset
        ahead.submit(_kernel(), grid, args, kwargs, x.device, (__name__, "_kernel", None))
    else:
        _kernel()[grid](*args, **kwargs)
    return out


def reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    act: bool = False,
) -> torch.Tensor:
    """What ``small_linear`` computes, in PyTorch ops: ``[residual +] F.linear(x', weight,
    bias)`` with x' = ``silu(gate) * up`` of x = [gate | up] (``act``), or ``RMSNorm(x) *
    norm_weight`` (``norm_weight``: layers.RMSNorm's order), or x."""
    return linear(x, weight, bias, norm_weight=norm_weight, eps=eps, residual=residual, act=act)


@torch.library.custom_op("draftctl::small_linear", mutates_args=())
def small_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    act: bool = False,
) -> torch.Tensor:
    """``reference(...)``: the Triton kernel for x [..., K] of at most ``MAX_ROWS`` tokens,
    ``reference`` itself for more (decided here, at run time, so that a compiled step traces
    no test of its token count)."""
    width = x.shape[-1]
    n = weight.shape[0]
    flat = x.reshape(-1, width)
    rows = flat.shape[0]
    if rows > MAX_ROWS or rows == 0:
        return reference(x, weight, bias, norm_weight, eps, residual, act)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    out = launch(flat, weight, bias, norm_weight=norm_weight, eps=eps, residual=residual, act=act)
    return out.reshape(*x.shape[:-1], n)


@small_linear.register_fake
def _(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    act: bool = False,
) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def fuses(tokens: int) -> bool:
    """Whether a ``fused`` runner's step of ``tokens`` tokens fuses its layers' parts."""
    return tokens <= FUSED_MAX_ROWS


def takes(x: torch.Tensor) -> bool:
    """Whether ``small_linear`` can run ``x``: floats on CUDA (or under the interpreter).
    Static properties only: the token count is tested inside the op."""
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    return x.device.type == "cuda" or triton_interpreted()


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    gemv: bool = False,
    fused: bool = False,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    act: bool = False,
) -> torch.Tensor:
    """``[residual +] F.linear(x', weight, bias)`` (``reference``'s parts). ``fused`` (where
    ``small_linear`` ``takes`` x): everything in ``small_linear``; else the parts in PyTorch
    ops around the product, which is ``small_linear``'s when ``gemv`` (a step of more than
    ``MAX_ROWS`` tokens then runs ``F.linear`` inside the op), else ``F.linear``."""
    if fused and takes(x):
        return small_linear(x, weight, bias, norm_weight, eps, residual, act)
    if act and norm_weight is not None:
        raise ValueError("act and norm_weight: one part before the product, not both")
    if act:
        gate, up = x.chunk(2, -1)
        x = F.silu(gate) * up
    if norm_weight is not None:
        x = F.rms_norm(x, (x.shape[-1],), eps=eps) * norm_weight
    out = small_linear(x, weight, bias) if gemv and takes(x) else F.linear(x, weight, bias)
    return out if residual is None else residual + out
