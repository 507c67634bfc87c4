"""Ragged batches without padded compute: the valid tokens of a ``[B, W]`` batch packed into one
``[1, N]`` row for the GEMMs, and scattered back to ``[B, W]`` for attention and cache writes.

A step verifies row r's ``k_r + 1`` tokens. Padding every row to the widest k makes the
projections, the MLP and the LM head pay for ``B x W`` tokens; packed they pay for
``N = sum(k_r + 1)``, so a row's own k (0 included) changes the step's cost. Attention and the
KV-cache writes keep the padded ``[B, W]`` layout (each row attends to its own cache slot);
padded positions hold zeros there and their outputs are dropped.

Two index vectors describe a packing: ``gather`` [N] picks the packed tokens out of the flattened
``B * W`` batch, ``scatter`` [N] puts them back. Eager packings compute both from a mask
(``nonzero``: a host sync); captured CUDA graphs take them from static buffers filled on the
host (engines/embedded/ragged.py), where the packed count is a bucket N >= the real count and
the extra entries gather token 0 and scatter into a scratch row ``B * W`` that is dropped.
"""

from __future__ import annotations

import torch


class Packing:
    def __init__(self, valid: torch.Tensor) -> None:
        """valid: [B, W] bool, True for the tokens that are computed (host sync: nonzero)."""
        index = valid.reshape(-1).nonzero().squeeze(1)  # [N] into the flattened B * W
        self._set(tuple(valid.shape), index, index)

    def _set(self, shape: tuple[int, ...], gather: torch.Tensor, scatter: torch.Tensor) -> None:
        self.shape = shape
        self.index = gather
        self.scatter = scatter
        self.num_tokens = int(gather.shape[0])  # metadata, no sync

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, width: int) -> Packing:
        """Row r keeps its first ``lengths[r]`` of ``width`` tokens."""
        columns = torch.arange(width, device=lengths.device)
        return cls(columns[None, :] < lengths[:, None])

    @classmethod
    def from_indices(
        cls, shape: tuple[int, int], gather: torch.Tensor, scatter: torch.Tensor
    ) -> Packing:
        """Precomputed indices (no host sync, graphable): ``scatter`` may name the scratch row
        ``B * W``, whose values ``unpack`` drops."""
        packing = cls.__new__(cls)
        packing._set(shape, gather, scatter)
        return packing

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, W, ...] -> [1, N, ...]"""
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.index)[None]

    def unpack(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """[1, N, ...] -> [B, W, ...], zeros where a row has no token.

        ``out`` ([>= B * W + 1, ...], a static buffer reused across calls): written in place and
        not zeroed first, so positions without a token keep stale values (callers read only
        the tokens a row computed)."""
        rows = self.shape[0] * self.shape[1]
        flat = x.new_zeros(rows + 1, *x.shape[2:]) if out is None else out[: rows + 1]
        flat.index_copy_(0, self.scatter, x[0])
        return flat[:rows].view(*self.shape, *x.shape[2:])


def pack(x: torch.Tensor, packing: Packing | None) -> torch.Tensor:
    return x if packing is None else packing.pack(x)


def unpack(x: torch.Tensor, packing: Packing | None) -> torch.Tensor:
    return x if packing is None else packing.unpack(x)
