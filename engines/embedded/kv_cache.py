"""Preallocated key/value cache: one contiguous slot per running request.

Layout ``[layers, slots, kv_heads, max_len + 1, head_dim]``: the rows of a batch are the slots
``[0, batch)``, so attention reads a plain view (no gather). The scheduler keeps running
requests packed in the lowest slots; ``move`` copies a slot when a request leaves. Position
``max_len`` of every slot is scratch: packed forwards send the cache writes of their padding
tokens there (engines/embedded/packing.py), and attention never reads it (keys ``< max_len``).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_layers, num_slots, num_kv_heads, max_len + 1, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.num_slots = num_slots

    @property
    def scratch_position(self) -> int:
        """The position written by padding tokens and never read."""
        return self.max_len

    @property
    def num_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def rows(self, layer: int, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``[count, kv_heads, max_len, head_dim]`` of slots ``first..first+count-1``."""
        return self.k[layer, first : first + count], self.v[layer, first : first + count]

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst`` (all layers)."""
        if src != dst and length > 0:
            self.k[:, dst, :, :length] = self.k[:, src, :, :length]
            self.v[:, dst, :, :length] = self.v[:, src, :, :length]
