"""Ragged batches without padded compute: the valid tokens of a ``[B, W]`` batch packed into one
``[1, N]`` row for the GEMMs, and scattered back to ``[B, W]`` for attention and cache writes.

A step verifies row r's ``k_r + 1`` tokens. Padding every row to the widest k makes the
projections, the MLP and the LM head pay for ``B x W`` tokens; packed they pay for
``N = sum(k_r + 1)``, so a row's own k (0 included) changes the step's cost. Attention and the
KV-cache writes keep the padded ``[B, W]`` layout (each row attends to its own cache slot);
padded positions hold zeros there and their outputs are dropped.
"""

from __future__ import annotations

import torch


class Packing:
    def __init__(self, valid: torch.Tensor) -> None:
        """valid: [B, W] bool, True for the tokens that are computed."""
        self.shape = tuple(valid.shape)
        self.index = valid.reshape(-1).nonzero().squeeze(1)  # [N] into the flattened B * W
        self.num_tokens = int(self.index.numel())

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, width: int) -> Packing:
        """Row r keeps its first ``lengths[r]`` of ``width`` tokens."""
        columns = torch.arange(width, device=lengths.device)
        return cls(columns[None, :] < lengths[:, None])

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, W, ...] -> [1, N, ...]"""
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.index)[None]

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[1, N, ...] -> [B, W, ...], zeros where a row has no token."""
        flat = x.new_zeros(self.shape[0] * self.shape[1], *x.shape[2:])
        flat.index_copy_(0, self.index, x[0])
        return flat.view(*self.shape, *x.shape[2:])


def pack(x: torch.Tensor, packing: Packing | None) -> torch.Tensor:
    return x if packing is None else packing.pack(x)


def unpack(x: torch.Tensor, packing: Packing | None) -> torch.Tensor:
    return x if packing is None else packing.unpack(x)
