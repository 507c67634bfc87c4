"""Ragged batches without padded compute: the valid tokens of a ``[B, W]`` batch packed into one
``[1, N]`` row for the GEMMs, and scattered back to ``[B, W]`` for attention and cache writes.

A step verifies row r's ``k_r + 1`` tokens. Padding every row to the widest k makes the
projections, the MLP and the LM head pay for ``B x W`` tokens; packed they pay for
``N = sum(k_r + 1)``, so a row's own k (0 included) changes the step's cost. Norms, RoPE and
the KV-cache writes run on the packed tokens too (``cache_slots`` says where each one writes);
only the attention itself takes the padded ``[B, W]`` layout (each row attends to its own cache
slot): with SDPA the queries are scattered straight into the grouped layout the attention
kernel reads (``grouped_queries``: ``[B, kv_heads, group * W, head_dim]``, one index kernel
that also does the head permutation) and the outputs gathered from it back into packed tokens
(``packed_output``, one index kernel): two index kernels per layer, no layout copies. Padded
positions hold stale or zero queries there and their outputs are dropped. The Triton attention
reads and writes the packed tokens in place (``token_map``, built once per forward:
``decode_attention.packed_decode_attention``), so its layers need neither index kernel.

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
        # A reused buffer for ``grouped_queries`` (None: each call allocates zeros).
        self.query_buffer: torch.Tensor | None = None
        self._grouped: tuple[tuple[int, int], tuple[torch.Tensor, ...]] | None = None

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

    def cache_slots(
        self, packed_positions: torch.Tensor, scratch_position: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each packed token writes its K/V: (row [N], position [N]) for positions [1, N]
        (``pack(positions)``). Padding tokens (scattered to the scratch row) write row 0's
        ``scratch_position``, which attention never reads (engines/embedded/kv_cache.py)."""
        width = self.shape[1]
        padding = self.scatter >= self.shape[0] * width
        rows = torch.where(padding, 0, self.scatter // width)
        return rows, torch.where(padding, scratch_position, packed_positions[0])

    def grouped_index(self, num_heads: int, num_kv_heads: int) -> tuple[torch.Tensor, ...]:
        """Where each packed token's heads live in the grouped query layout
        ``[B, kv_heads, group * W, head_dim]`` (``cached_attention``'s: query head h of row r,
        column c at ``[r, h // group, (h % group) * W + c]``, i.e. flat row ``(r * heads + h) *
        W + c``). Returns (scatter [N, heads] flat rows, the scratch row ``B * heads * W`` for
        padding tokens; gather: batch, kv head, query index [N, heads], padding tokens at 0).
        Built once per forward (a few small kernels) and shared by every layer."""
        if self._grouped is not None and self._grouped[0] == (num_heads, num_kv_heads):
            return self._grouped[1]
        batch, width = self.shape
        group = num_heads // num_kv_heads
        padding = (self.scatter >= batch * width)[:, None]
        row, column = self.scatter // width, self.scatter % width
        heads = torch.arange(num_heads, device=self.scatter.device)[None, :]
        flat = (row[:, None] * num_heads + heads) * width + column[:, None]
        scatter = torch.where(padding, batch * num_heads * width, flat)
        rows = torch.where(padding, 0, row[:, None].expand_as(flat))
        kv_heads = (heads // group).expand_as(flat)
        queries = torch.where(padding, 0, (heads % group) * width + column[:, None])
        index = (scatter, rows, kv_heads, queries)
        self._grouped = ((num_heads, num_kv_heads), index)
        return index

    def token_map(self) -> torch.Tensor:
        """[B, W] int32: the packed index of row b's column c, -1 where the row has no token
        (what the Triton attention reads packed queries by, ``packed_decode_attention``: no
        layout copies). Built once per forward, in one index kernel; a bucket's padding tokens
        (scattered to the scratch row) appear nowhere."""
        batch, width = self.shape
        device = self.scatter.device
        flat = torch.full((batch * width + 1,), -1, dtype=torch.int32, device=device)
        flat[self.scatter] = torch.arange(self.num_tokens, dtype=torch.int32, device=device)
        return flat[:-1].view(batch, width)

    def grouped_queries(self, q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
        """Packed queries [1, N, heads, head_dim] (a strided view is fine) -> the grouped layout
        [B, kv_heads, group * W, head_dim] that ``grouped_attention`` reads, in one index
        kernel: into ``query_buffer`` when set (positions without a token keep finite stale
        queries whose outputs are dropped), else into zeros."""
        batch, width = self.shape
        heads, head_dim = q.shape[2:]
        scatter = self.grouped_index(heads, num_kv_heads)[0]
        size = batch * heads * width + 1  # + the scratch row
        flat = (
            q.new_zeros(size, head_dim)
            if self.query_buffer is None
            else self.query_buffer[: size * head_dim].view(size, head_dim)
        )
        flat.index_put_((scatter,), q[0])
        group = heads // num_kv_heads
        return flat[:-1].view(batch, num_kv_heads, group * width, head_dim)

    def packed_output(self, out: torch.Tensor, num_heads: int) -> torch.Tensor:
        """Attention output in the grouped layout [B, kv_heads, group * W, head_dim] (any
        strides) -> packed [1, N, heads * head_dim], in one index kernel."""
        _, rows, kv_heads, queries = self.grouped_index(num_heads, out.shape[1])
        packed = out[rows, kv_heads, queries]  # [N, heads, head_dim]
        return packed.view(1, packed.shape[0], -1)

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
