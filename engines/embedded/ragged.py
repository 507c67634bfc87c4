"""Ragged verify shapes for CUDA graphs: which packed token counts are captured, which one a step
replays, and the static index buffers that pack its rows (engines/embedded/packing.py).

A ragged verify graph is keyed on (batch bucket B, width bucket W, token bucket N): attention
and cache writes run at the padded ``[B, W]`` layout, every GEMM (projections, MLP, LM head) on
N packed tokens, N >= the step's ``sum(k_r + 1)``. Token buckets follow one ladder: multiples of
``min_step`` up to ``min_step * steps_per_doubling``, then ``steps_per_doubling`` equal steps per
doubling, so a step computes at most ``1 / steps_per_doubling`` more tokens than it uses (plus
``min_step`` at small N, where a step is bound by weight reads, not tokens). A (B, W) pair gets
only the buckets its steps can reach and that are smaller than ``B * W``: a step whose bucket
would reach ``B * W`` replays the padded graph instead, which computes the same tokens.

Everything here runs on the host from the k each row verifies (known before the step), so the
captured region needs no ``nonzero`` or other host sync.

On a CUDA device the runner then times every captured graph once and keeps only the buckets
that are faster than the padded graph they would replace (``RaggedShapes.keep_faster``): what a
ragged step saves in GEMM rows it partly pays back in index kernels, so the token count at
which it stops paying is measured per (B, W) on the machine, not assumed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from engines.embedded.cuda_graphs import padded_size

MIN_TOKEN_STEP = 8
TOKEN_STEPS_PER_DOUBLING = 8


def token_ladder(
    max_tokens: int,
    min_step: int = MIN_TOKEN_STEP,
    steps_per_doubling: int = TOKEN_STEPS_PER_DOUBLING,
) -> list[int]:
    """Token buckets up to (and including the first one >= ) ``max_tokens``."""
    if min_step < 1 or steps_per_doubling < 1:
        raise ValueError(f"min_step={min_step}, steps_per_doubling={steps_per_doubling}: use >= 1")
    sizes = [min_step]
    while sizes[-1] < max_tokens:
        n = sizes[-1]
        sizes.append(n + max(min_step, (1 << (n.bit_length() - 1)) // steps_per_doubling))
    return sizes


class RaggedShapes:
    """The captured (B, W, N) keys of one runner and the choice of key for a step."""

    def __init__(
        self,
        batch_sizes: list[int],
        widths: list[int],
        min_step: int = MIN_TOKEN_STEP,
        steps_per_doubling: int = TOKEN_STEPS_PER_DOUBLING,
    ) -> None:
        self.batch_sizes, self.widths = batch_sizes, widths
        ladder = token_ladder(batch_sizes[-1] * widths[-1], min_step, steps_per_doubling)
        self.buckets: dict[tuple[int, int], list[int]] = {}
        for i, batch in enumerate(batch_sizes):
            for j, width in enumerate(widths):
                # The fewest tokens a step padded to (batch, width) verifies: one more row than
                # the next smaller batch bucket, one of them one token wider than the next
                # smaller width bucket, every other row one token.
                fewest = (batch_sizes[i - 1] if i else 0) + (widths[j - 1] if j else 0) + 1
                first = padded_size(min(fewest, ladder[-1]), ladder)
                reachable = [n for n in ladder if first <= n < batch * width]
                if reachable:
                    self.buckets[batch, width] = reachable

    @property
    def keys(self) -> list[tuple[int, int, int]]:
        """Every captured (B, W, N), largest first (capture order: smaller graphs reuse memory)."""
        keys = [(b, w, n) for (b, w), sizes in self.buckets.items() for n in sizes]
        return sorted(keys, key=lambda key: (key[0] * key[1], key[2]), reverse=True)

    def keep_faster(
        self,
        ragged_s: Mapping[tuple[int, int, int], float],
        padded_s: Mapping[tuple[int, int], float],
    ) -> list[tuple[int, int, int]]:
        """Keep, per (B, W), the token buckets whose measured step is faster than the padded
        step of that (B, W): the smallest ones, up to the first that is not (a ragged step
        of ``N < B * W`` tokens can cost more than the padded ``B * W``: its attention runs at
        the padded layout plus two index kernels per layer, so near ``B * W`` the saved GEMM
        rows do not pay for them). Buckets without a measurement are kept. Returns the keys
        dropped; a dropped bucket's steps replay the padded graph."""
        dropped: list[tuple[int, int, int]] = []
        for (batch, width), sizes in list(self.buckets.items()):
            padded = padded_s.get((batch, width))
            if padded is None:
                continue
            kept = 0
            while kept < len(sizes) and ragged_s.get((batch, width, sizes[kept]), 0.0) < padded:
                kept += 1
            dropped += [(batch, width, n) for n in sizes[kept:]]
            if kept:
                self.buckets[batch, width] = sizes[:kept]
            else:
                del self.buckets[batch, width]
        return dropped

    def keep_faster_search(
        self,
        measure: Callable[[tuple[int, int, int]], float],
        padded_s: Mapping[tuple[int, int], float],
    ) -> tuple[list[tuple[int, int, int]], dict[tuple[int, int, int], float]]:
        """``keep_faster`` measuring only what a binary search over each (B, W)'s buckets
        needs: a ragged step's time grows with its token count, so the buckets kept are those
        below the first one not faster than the padded step, found in ~log2(buckets) + 1
        measurements instead of one per bucket (~70 graphs timed of ~180 on the 8B shape).
        Where noise makes the times not grow, the cut may fall one bucket away from a full
        scan's. Returns the dropped keys and the times measured."""
        measured: dict[tuple[int, int, int], float] = {}
        dropped: list[tuple[int, int, int]] = []
        for (batch, width), sizes in list(self.buckets.items()):
            padded = padded_s.get((batch, width))
            if padded is None:
                continue
            lo, hi = 0, len(sizes)  # invariant: sizes[:lo] faster, sizes[hi:] not
            while lo < hi:
                mid = (lo + hi) // 2
                key = (batch, width, sizes[mid])
                measured[key] = measure(key)
                if measured[key] < padded:
                    lo = mid + 1
                else:
                    hi = mid
            dropped += [(batch, width, n) for n in sizes[lo:]]
            if lo:
                self.buckets[batch, width] = sizes[:lo]
            else:
                del self.buckets[batch, width]
        return dropped, measured

    def choose(self, lengths: list[int], batch: int, width: int) -> int | None:
        """The token bucket for rows of ``lengths`` tokens padded to (batch, width), or None
        when the padded graph computes no more (every bucket would reach ``batch * width``)."""
        sizes = self.buckets.get((batch, width), [])
        num_tokens = sum(lengths)
        if not sizes or num_tokens > sizes[-1]:
            return None
        return padded_size(num_tokens, sizes)


def ragged_index(lengths: list[int], batch: int, width: int, num_tokens: int) -> torch.Tensor:
    """[2, num_tokens] int64 (CPU): row 0 gathers each row's first ``lengths[r]`` tokens out of the
    flattened ``[batch, width]`` batch, row 1 scatters them back; the entries past
    ``sum(lengths)`` gather token 0 and scatter into the scratch row ``batch * width``."""
    used = sum(lengths)
    if len(lengths) > batch or max(lengths) > width or used > num_tokens:
        raise ValueError(
            f"lengths {lengths} (sum {used}) do not fit batch {batch}, width {width}, "
            f"{num_tokens} tokens"
        )
    # numpy, then one tensor: on a two-phase step this runs between draft and verify (the
    # torch version took ~70 us at 64 rows on this CPU).
    valid = np.arange(width)[None, :] < np.asarray(lengths)[:, None]  # [rows, width]
    flat = np.flatnonzero(valid)
    index = np.empty((2, num_tokens), dtype=np.int64)
    index[0, :used], index[1, :used] = flat, flat
    index[0, used:], index[1, used:] = 0, batch * width
    return torch.from_numpy(index)


def full_rows(num_tokens: int, width: int) -> list[int]:
    """Row lengths that fill ``num_tokens`` with rows of ``width`` (the last one shorter): the
    lengths a graph of that token count is captured with."""
    full, rest = divmod(num_tokens, width)
    return [width] * full + ([rest] if rest else [])
