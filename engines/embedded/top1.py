"""A step's argmax and the draft's confidence (top-1 probability) in one read of the logits.

A step that measures the draft's confidence (a two-phase step, or ``measure_confidence``)
reduces the draft's logits [B, W, vocab] to their argmax (the drafts) and to each position's
top-1 probability, ``exp(max - logsumexp)``. In PyTorch ops that is ``argmax``, ``amax`` and
``logsumexp`` (itself a max, an exp-and-sum and a log): five or more passes over the logits,
each its own launch, with ``logsumexp`` rounded in bf16.

``top1(logits, with_prob=True)`` reads each position's logits once: program (position, split)
walks its slice of the vocabulary with a per-lane running max, the first column where each lane
reached it, and the lane's sum of ``exp(x - max)`` rescaled as the max grows (the online
softmax), accumulated in fp32; the lanes then combine. Splits give a few positions (one row)
enough programs to fill the device; with more than one, a second kernel merges the splits'
partials. The argmax is torch's: the first index of the largest value (ties to the lower
index), so greedy tokens are unchanged; the probability is ``1 / sum(exp(x - max))``.

Measured on the H100 8B shape (``bench/device_step_gpu.py --top1``, bf16 logits of 151,936,
``bench/results/device_step_top1_h100_2026-12-07s51.json``): argmax and probability together
0.41 against 1.09 ms at 64 rows x 15 positions, 0.22 against 0.63 at 64 x 8, 0.13 against
0.22 at 1 x 15, with the probability's error against a float64 softmax 4e-7 against 0.05
(bf16 ``logsumexp``); the argmax alone was slower than torch's (0.27 against 0.17 ms at
64 x 15, 0.13 against 0.03 at 1 x 15: each program walks its slice with too few loads in
flight), so ``top1(logits)`` without the probability is torch's ``argmax``.

The kernels run for CUDA tensors (or the CPU under ``TRITON_INTERPRET=1``: tests) whose last
dimension is contiguous; ``reference`` (the PyTorch ops) otherwise.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from engines.embedded.decode_attention import triton_interpreted

BLOCK = 2048  # logits a program reads per iteration
WARPS = 8
TARGET_PROGRAMS = 264  # splits are chosen to launch about this many programs (2 per H200 SM)
MAX_SPLITS = 32
INTERPRETED_BLOCK = 256  # the CPU interpreter: small tiles (tests' vocabularies are small)


@cache
def _kernels() -> tuple[Any, Any]:
    import triton
    import triton.language as tl

    # Sizes and strides are plain arguments: one binary per (one split or more, block).
    @triton.jit(
        do_not_specialize=["positions", "n_cols", "stride_b", "stride_k", "chunk", "splits"]
    )
    def top1_kernel(
        x_ptr,
        idx_ptr,  # [N] int64 (one split) or [N, splits] int64 partials
        prob_ptr,  # [N] fp32 (one split) or [N, splits] fp32 partial max
        sum_ptr,  # [N, splits] fp32 partial sums (more than one split)
        positions,
        n_cols,
        stride_b,
        stride_k,
        chunk,  # columns per split (a multiple of BLOCK)
        splits,  # the partials' row stride
        ONE_SPLIT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        split = tl.program_id(1)
        b = row // positions
        j = row % positions
        base = x_ptr + b.to(tl.int64) * stride_b + j.to(tl.int64) * stride_k
        offs = tl.arange(0, BLOCK)
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        total = tl.zeros((BLOCK,), tl.float32)
        at = tl.zeros((BLOCK,), tl.int32)
        begin = split * chunk
        end = tl.minimum(begin + chunk, n_cols)
        for start in range(begin, end, BLOCK):
            cols = start + offs
            x = tl.load(base + cols, mask=cols < end, other=float("-inf")).to(tl.float32)
            at = tl.where(x > best, cols, at)  # strictly larger: each lane keeps its first
            grown = tl.maximum(best, x)
            safe = tl.where(grown == float("-inf"), 0.0, grown)
            total = total * tl.exp(best - safe) + tl.exp(x - safe)
            best = grown
        top = tl.max(best, axis=0)
        first = tl.min(tl.where(best == top, at, 2147483647), axis=0)
        safe_top = tl.where(top == float("-inf"), 0.0, top)
        mass = tl.sum(total * tl.exp(best - safe_top), axis=0)
        if ONE_SPLIT:
            tl.store(idx_ptr + row, first.to(tl.int64))
            tl.store(prob_ptr + row, 1.0 / mass)
        else:
            tl.store(idx_ptr + row * splits + split, first.to(tl.int64))
            tl.store(prob_ptr + row * splits + split, top)
            tl.store(sum_ptr + row * splits + split, mass)

    @triton.jit(do_not_specialize=["splits"])
    def merge_kernel(
        part_idx_ptr,
        part_max_ptr,
        part_sum_ptr,
        idx_ptr,
        prob_ptr,
        splits,
        LANES: tl.constexpr,  # MAX_SPLITS: one binary for every split count
    ):
        row = tl.program_id(0)
        lanes = tl.arange(0, LANES)
        valid = lanes < splits
        tops = tl.load(part_max_ptr + row * splits + lanes, mask=valid, other=float("-inf"))
        ats = tl.load(part_idx_ptr + row * splits + lanes, mask=valid, other=0)
        top = tl.max(tops, axis=0)
        # splits cover increasing columns: the first split holding the max holds the first
        first = tl.min(tl.where((tops == top) & valid, ats, 9223372036854775807), axis=0)
        tl.store(idx_ptr + row, first)
        sums = tl.load(part_sum_ptr + row * splits + lanes, mask=valid, other=0.0)
        safe_top = tl.where(top == float("-inf"), 0.0, top)
        mass = tl.sum(sums * tl.exp(tops - safe_top), axis=0)
        tl.store(prob_ptr + row, 1.0 / mass)

    return top1_kernel, merge_kernel


def num_splits(rows: int, n_cols: int, block: int, most: int = MAX_SPLITS) -> int:
    """Vocabulary splits per position: enough programs to fill the device for a few
    positions, one for many; never more splits than blocks of columns."""
    blocks = max(1, -(-n_cols // block))
    wanted = max(1, -(-TARGET_PROGRAMS // max(1, rows)))
    return min(wanted, blocks, most)


def takes(logits: torch.Tensor) -> bool:
    """Whether the kernels can run ``logits``: floats on CUDA (or under the interpreter),
    [B, W, vocab] with a contiguous last dimension."""
    if logits.dim() != 3 or logits.shape[-1] == 0 or logits.stride(-1) != 1:
        return False
    if logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    return logits.device.type == "cuda" or triton_interpreted()


def reference(logits: torch.Tensor, with_prob: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``top1`` in PyTorch ops, as the engine computed it before the kernels: argmax [B, W]
    and (``with_prob``) the top-1 probability ``exp(max - logsumexp)`` [B, W] in fp32,
    without a [B, W, vocab] fp32 copy: the ``logsumexp`` runs in the logits' dtype (bf16
    rounds it to ~0.03 at a 150k vocabulary's, a few percent of the probability; the kernels
    accumulate in fp32)."""
    index = logits.argmax(dim=-1)
    if not with_prob:
        return index, None
    top = logits.amax(dim=-1).float()
    return index, (top - torch.logsumexp(logits, dim=-1).float()).exp()


def top1(
    logits: torch.Tensor, with_prob: bool = False, splits: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Argmax [B, W] (int64) of logits [B, W, vocab] and, with ``with_prob``, each position's
    top-1 probability [B, W] (fp32): the kernels where ``takes``, else ``reference``.
    ``splits``: the vocabulary splits per position (tests; default ``num_splits``)."""
    if not with_prob or not takes(logits) or logits.shape[0] * logits.shape[1] == 0:
        return reference(logits, with_prob)
    batch, positions, n_cols = logits.shape
    rows = batch * positions
    block = INTERPRETED_BLOCK if triton_interpreted() else BLOCK
    count = min(MAX_SPLITS, splits if splits is not None else num_splits(rows, n_cols, block))
    per_split = -(-n_cols // count)
    chunk = -(-per_split // block) * block  # columns per split, whole blocks
    count = -(-n_cols // chunk)
    top1_kernel, merge_kernel = _kernels()
    device = logits.device
    index = torch.empty(rows, dtype=torch.int64, device=device)
    prob = torch.empty(rows, dtype=torch.float32, device=device)
    stride_b, stride_k = logits.stride(0), logits.stride(1)
    if count == 1:
        top1_kernel[(rows, 1)](
            logits, index, prob, prob, positions, n_cols, stride_b, stride_k, chunk, 1,
            ONE_SPLIT=True, BLOCK=block, num_warps=WARPS,
        )  # fmt: skip
    else:
        part_idx = torch.empty(rows, count, dtype=torch.int64, device=device)
        part_max = torch.empty(rows, count, dtype=torch.float32, device=device)
        part_sum = torch.empty(rows, count, dtype=torch.float32, device=device)
        top1_kernel[(rows, count)](
            logits, part_idx, part_max, part_sum, positions, n_cols, stride_b, stride_k, chunk,
            count, ONE_SPLIT=False, BLOCK=block, num_warps=WARPS,
        )  # fmt: skip
        merge_kernel[(rows,)](
            part_idx, part_max, part_sum, index, prob, count,
            LANES=MAX_SPLITS, num_warps=1,
        )  # fmt: skip
    return index.view(batch, positions), prob.view(batch, positions)
