"""The DFlash draft: a few non-causal layers that denoise a block ``[last token, mask, ...]``
while attending to context K/V projected from the target's hidden states.

Draft cache invariant: for a request whose next verify starts at position ``s``, draft cache
positions ``[0, s)`` hold the *context* K/V of the target features at those positions.
``insert_context`` writes them after every verify (for all verified positions; the rejected
tail is overwritten later and never read), ``propose`` writes the noise block's K/V at
``[s, s + block)`` and attends to every key ``< s + block`` (bidirectional inside the block).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engines.embedded.checkpoint import DraftSpec
from engines.embedded.events import CompileMode
from engines.embedded.gemv import fuses, linear
from engines.embedded.kv_cache import KVCache
from engines.embedded.layers import (
    DecoderLayer,
    RMSNorm,
    Rotary,
    attention_mask,
    cache_rows,
    cached_attention,
    decoder_layers,
    load_strict,
    write_cache,
    write_cache_at,
)
from engines.embedded.packing import Packing, pack, unpack
from engines.embedded.regional import compile_layer_step, dense, mark_dynamic
from engines.embedded.target import TargetModel


def draft_layer_step(
    layer: DecoderLayer,
    h: torch.Tensor,
    rope: tuple[torch.Tensor, ...],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    written: torch.Tensor,
    rows: Packing | None,
    mask: torch.Tensor,
    num_keys: int,
    fused: bool = False,
) -> torch.Tensor:
    """One layer of ``DraftModel.propose``: the block's K/V written into the layer's cache
    rows, attention over the context and the block, the MLP; the residual stream after it.
    ``fused``: as ``target_layer_step``'s."""
    q, k, v = (unpack(t, rows) for t in layer.qkv(h, rope, fused))
    write_cache(k_cache, positions, k, rows=written)
    write_cache(v_cache, positions, v, rows=written)
    attn = cached_attention(q, k_cache[:, :, :num_keys], v_cache[:, :, :num_keys], mask)
    return layer.feed_forward(layer.attention_residual(h, pack(attn, rows), fused), fused)


class DraftModel(nn.Module):
    def __init__(self, spec: DraftSpec, max_positions: int) -> None:
        super().__init__()
        shape = spec.shape
        self.spec = spec
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_layers))
        self.fc = nn.Linear(
            len(spec.target_layer_ids) * shape.hidden_size, shape.hidden_size, bias=False
        )
        self.hidden_norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.rotary = Rotary(shape.head_dim, shape.rope_theta, max_positions)
        # The context projection through gemv.small_linear (its layers have their own).
        self.gemv = False
        self.fuse_small_steps = False  # as TargetModel's

    # One layer of ``propose`` (``draft_layer_step``); ``compile_layers`` compiles it.
    layer_step: Callable[..., torch.Tensor] = staticmethod(draft_layer_step)
    compiled_layers = False  # as TargetModel's

    def compile_layers(self, mode: CompileMode = "default") -> None:
        """Regional compilation of ``propose``: its layer step compiled once for all layers
        (``TargetModel.compile_layers``). The context insert (a projection and a cache write
        per layer) stays eager."""
        self.layer_step = compile_layer_step(draft_layer_step, mode)
        self.compiled_layers = True

    def load_checkpoint(self, weights: dict[str, torch.Tensor]) -> None:
        state = {
            k.removeprefix("model."): v
            for k, v in weights.items()
            if not k.startswith(("embed_tokens", "lm_head", "model.embed_tokens"))
        }
        load_strict(self, state, "draft")

    def fuse(self) -> None:
        for layer in decoder_layers(self.layers):
            layer.fuse()

    def insert_context(
        self,
        features: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        first_slot: int = 0,
        packing: Packing | None = None,
        slots: torch.Tensor | None = None,
    ) -> None:
        """features: [B, W, len(target_layer_ids) * hidden] at positions [B, W] (packed
        ``[1, N, ...]`` with ``packing``); ``slots``: as in ``TargetModel.forward``."""
        context = self.hidden_norm(linear(features, self.fc.weight, self.fc.bias, self.gemv))
        token_positions = pack(positions, packing)
        rope = self.rotary.tables(token_positions, context.dtype)
        packed = None if packing is None else packing.cache_slots(token_positions, cache.max_len)
        written = cache_rows(positions, slots) if packed is None else None
        for index, layer in enumerate(decoder_layers(self.layers)):
            k, v = layer.key_value(context)
            k = Rotary.rotate(k, rope)
            if slots is not None:
                for full, values in zip(cache.rows(index, 0, cache.num_slots), (k, v), strict=True):
                    write_cache(full, positions, values, slots, written)
                continue
            k_cache, v_cache = cache.rows(index, first_slot, positions.shape[0])
            if packed is None:
                write_cache(k_cache, positions, k, rows=written)
                write_cache(v_cache, positions, v, rows=written)
            else:
                write_cache_at(k_cache, packed, k)
                write_cache_at(v_cache, packed, v)

    def propose(
        self,
        block_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        target: TargetModel,
        first_slot: int = 0,
        num_keys: int | None = None,
        rows: Packing | None = None,
        outputs: Packing | None = None,
        num_outputs: int | None = None,
    ) -> torch.Tensor:
        """block_ids: [B, block] = last token then mask tokens, at positions [B, block].

        Returns draft logits [B, block - 1, vocab] for positions ``s + 1 .. s + block - 1``.
        ``rows`` (over [B, block]) computes only the rows that draft; ``outputs`` (over
        [B, block - 1]) only the logits that are used; the rest are zeros. ``num_outputs``:
        only the first ``num_outputs`` positions' logits, [B, num_outputs, vocab] (every block
        token still runs through the layers: the block attends to itself both ways), for the
        fixed shapes of CUDA graphs, where ``outputs`` cannot vary per step."""
        if num_outputs is not None and (
            outputs is not None or not 1 <= num_outputs < block_ids.shape[1]
        ):
            raise ValueError(
                f"num_outputs={num_outputs}: use 1..{block_ids.shape[1] - 1}, without outputs"
            )
        num_keys = num_keys or cache.max_len
        batch = block_ids.shape[0]
        key_positions = torch.arange(num_keys, device=block_ids.device)
        end = positions[:, -1:] + 1  # [B, 1]: s + block
        visible = (key_positions[None, :] < end)[:, None, :].expand(-1, block_ids.shape[1], -1)
        shape = self.spec.shape
        mask = attention_mask(visible, shape.num_heads, shape.num_kv_heads)
        h = target.embed_tokens(pack(block_ids, rows)) * self.spec.input_embedding_scale
        # The rows' tokens (packed with ``rows``) are normed and rotated before unpacking.
        rope = tuple(pack(t, rows) for t in self.rotary.tables(positions, h.dtype))
        written = cache_rows(positions)
        if self.compiled_layers:  # dynamic batch from the first compile (regional.py)
            written, mask = dense(written), dense(mask)
            for tensor in (h, *rope, positions, written):  # [B, block, ...] or [1, N, ...]
                mark_dynamic(tensor, 0, 1)
            mark_dynamic(mask, 0)
        step = self.layer_step
        fused = self.fuse_small_steps and fuses(h.shape[0] * h.shape[1])
        for index, layer in enumerate(decoder_layers(self.layers)):
            k_cache, v_cache = cache.rows(index, first_slot, batch)
            if self.compiled_layers:
                mark_dynamic(k_cache, 0)
                mark_dynamic(v_cache, 0)
            h = step(
                layer, h, rope, k_cache, v_cache, positions, written, rows, mask, num_keys, fused
            )
        end_output = None if num_outputs is None else 1 + num_outputs
        after_first = pack(unpack(h, rows)[:, 1:end_output], outputs)
        logits = unpack(target.logits(self.norm(after_first)), outputs)
        if self.spec.output_multiplier != 1.0:  # x 1.0 is exact: skip a [B, k, vocab] copy
            logits = logits * self.spec.output_multiplier
        cap = self.spec.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits
