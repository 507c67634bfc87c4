"""The target model (Qwen3 / Llama): a causal forward over new tokens against the KV cache that
also returns the residual stream after the layers the draft reads (``target_layer_ids``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engines.embedded.checkpoint import ModelShape
from engines.embedded.decode_attention import MAX_GROUPED_QUERIES
from engines.embedded.events import Attention, CompileMode
from engines.embedded.gemv import fuses, linear
from engines.embedded.kv_cache import KVCache
from engines.embedded.layers import (
    AttentionMask,
    DecoderLayer,
    KeyPositions,
    RMSNorm,
    Rotary,
    attention_mask,
    cache_rows,
    cached_attention,
    decoder_layers,
    grouped_attention,
    load_strict,
    packed_attention,
    write_cache,
    write_cache_at,
)
from engines.embedded.packing import Packing, pack
from engines.embedded.regional import compile_layer_step, dense, mark_dynamic


def target_layer_step(
    layer: DecoderLayer,
    h: torch.Tensor,
    rope: tuple[torch.Tensor, ...],
    k_part: torch.Tensor,
    v_part: torch.Tensor,
    positions: torch.Tensor,
    written: torch.Tensor | None,
    packed: tuple[torch.Tensor, torch.Tensor] | None,
    packing: Packing | None,
    slots: torch.Tensor | None,
    mask: AttentionMask,
    num_keys: int,
    fused: bool = False,
) -> torch.Tensor:
    """One decoder layer of ``TargetModel.forward``: its K/V written into the layer's cache
    rows (``k_part``, ``v_part``: the batch's rows, or every slot's when ``slots`` is given),
    attention over them, the MLP; returns the residual stream after the layer. ``fused``: the
    norms and residual adds inside the linear layers' kernels (``DecoderLayer.qkv``)."""
    q, k, v = layer.qkv(h, rope, fused)
    if slots is not None:  # write the slots' rows, then read copies of them
        for full, values in zip((k_part, v_part), (k, v), strict=True):
            write_cache(full, positions, values, slots, written)
        k_cache, v_cache = (full.index_select(0, slots) for full in (k_part, v_part))
    else:
        k_cache, v_cache = k_part, v_part
        for part, values in zip((k_cache, v_cache), (k, v), strict=True):
            if packed is None:
                write_cache(part, positions, values, rows=written)
            else:
                write_cache_at(part, packed, values)
    k_cache, v_cache = k_cache[:, :, :num_keys], v_cache[:, :, :num_keys]
    if packing is None:
        attn = cached_attention(q, k_cache, v_cache, mask)
    elif isinstance(mask, KeyPositions) and mask.tokens is not None:
        attn = packed_attention(q, k_cache, v_cache, mask)  # Triton: the packed tokens in place
    else:  # queries scattered straight into the grouped layout, outputs gathered from it
        grouped = packing.grouped_queries(q, layer.num_kv_heads)
        out = grouped_attention(grouped, k_cache, v_cache, mask)
        attn = packing.packed_output(out, layer.num_heads)
    return layer.feed_forward(layer.attention_residual(h, attn, fused), fused)


def _dynamic_inputs(
    h: torch.Tensor,
    rope: tuple[torch.Tensor, ...],
    positions: torch.Tensor,
    written: torch.Tensor | None,
    packed: tuple[torch.Tensor, torch.Tensor] | None,
    mask: AttentionMask,
    slots: torch.Tensor | None,
) -> tuple[torch.Tensor | None, AttentionMask]:
    """Before a compiled layer step's calls: the batch, width, packed-token and prompt-length
    dimensions of its inputs marked dynamic, the expanded ones made row-major (regional.py).
    Returns (written, mask) to pass instead."""
    for tensor in (h, *rope):  # [B, W, ...], or [1, N, ...] packed
        mark_dynamic(tensor, 0, 1)
    mark_dynamic(positions, 0, 1)
    for index in packed or ():
        mark_dynamic(index, 0)
    mark_dynamic(slots, 0)
    if written is not None:
        written = dense(written)
        mark_dynamic(written, 0, 1)
    if isinstance(mask, KeyPositions):
        if mask.tokens is not None:
            mark_dynamic(mask.tokens, 0, 1)
        return written, mask
    mask = dense(mask)  # [B, 1, group * W, keys]
    mark_dynamic(mask, 0, 2)
    return written, mask


class TargetModel(nn.Module):
    def __init__(
        self, shape: ModelShape, max_positions: int, aux_layer_ids: tuple[int, ...]
    ) -> None:
        super().__init__()
        self.shape = shape
        self.aux_layer_ids = aux_layer_ids
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        self.rotary = Rotary(shape.head_dim, shape.rope_theta, max_positions)
        # The attention kernel: "sdpa" (a dense mask) or "triton" (the split-KV kernel of
        # decode_attention.py, reading only the keys each row uses; CUDA).
        self.attention: Attention = "sdpa"
        # The LM head through gemv.small_linear (its layers have their own ``gemv``).
        self.gemv = False
        # Steps of at most gemv.FUSED_MAX_ROWS tokens fuse the layers' norms and residual adds into
        # the linear kernels (ModelRunner(linear="fused")).
        self.fuse_small_steps = False

    # One decoder layer's step (``target_layer_step``); ``compile_layers`` swaps in its
    # compiled form.
    layer_step: Callable[..., torch.Tensor] = staticmethod(target_layer_step)

    # Whether ``layer_step`` is compiled: forwards then mark their varying dimensions dynamic
    # and pass row-major inputs (engines/embedded/regional.py).
    compiled_layers = False

    def compile_layers(self, mode: CompileMode = "default") -> None:
        """Regional compilation: compile one decoder layer's step, which every layer reuses
        (the layers differ only in their weights, which the compiled code takes as inputs),
        instead of the whole forward. Start-up then costs one compile per input shape class
        rather than one whose size grows with the number of layers (docs/engine.md); every
        forward (verifies padded and ragged, graph and packed prefills) shares the function,
        and its dynamic dimensions are marked up front (``regional.py``)."""
        self.layer_step = compile_layer_step(target_layer_step, mode)
        self.compiled_layers = True

    def load_checkpoint(self, weights: dict[str, torch.Tensor]) -> None:
        """Load HF ``model.*`` / ``lm_head`` tensors; ties the head to the embedding if needed."""
        state = {k.removeprefix("model."): v for k, v in weights.items()}
        if self.shape.tie_word_embeddings or "lm_head.weight" not in state:
            state["lm_head.weight"] = state["embed_tokens.weight"]
        load_strict(self, state, "target")

    def fuse(self) -> None:
        """Fuse projection weights after loading (see ``DecoderLayer.fuse``)."""
        for layer in decoder_layers(self.layers):
            layer.fuse()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        first_slot: int = 0,
        num_keys: int | None = None,
        packing: Packing | None = None,
        slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, positions: [B, W] for slots ``first_slot..+B``. Writes K/V at ``positions``
        and attends causally to cached keys ``< num_keys`` (default: the whole cache).
        ``slots`` ([B] device tensor, no ``packing``): the rows' slots given as data instead
        of ``first_slot`` (a captured prefill graph serves any slot).

        Returns (final-normed hidden [B, W, hidden], aux features [B, W, len(aux) * hidden]);
        with ``packing`` only its valid tokens are computed and both come back packed
        ``[1, N, ...]``."""
        num_keys = num_keys or cache.max_len
        batch = input_ids.shape[0]
        mask: AttentionMask
        group = self.shape.num_heads // self.shape.num_kv_heads
        if self.attention == "triton" and group * positions.shape[1] <= MAX_GROUPED_QUERIES:
            # steps; prefills (long W) keep SDPA. Packed: queries read where they are.
            mask = KeyPositions(positions, None if packing is None else packing.token_map())
        else:
            key_positions = torch.arange(num_keys, device=input_ids.device)
            visible = key_positions[None, None, :] <= positions[:, :, None]  # [B, W, num_keys]
            mask = attention_mask(visible, self.shape.num_heads, self.shape.num_kv_heads)
        h = self.embed_tokens(pack(input_ids, packing))
        # Packed: norms, RoPE and cache writes on the N packed tokens, attention at [B, W].
        token_positions = pack(positions, packing)
        rope = self.rotary.tables(token_positions, h.dtype)
        packed = None if packing is None else packing.cache_slots(token_positions, cache.max_len)
        written = cache_rows(positions, slots) if packed is None else None
        if packing is not None and not isinstance(mask, KeyPositions):
            # built once here, shared by every layer's attention
            packing.grouped_index(self.shape.num_heads, self.shape.num_kv_heads)
        if self.compiled_layers:
            written, mask = _dynamic_inputs(h, rope, positions, written, packed, mask, slots)
        saved: dict[int, torch.Tensor] = {}
        step = self.layer_step
        fused = self.fuse_small_steps and fuses(h.shape[0] * h.shape[1])
        for index, layer in enumerate(decoder_layers(self.layers)):
            if slots is not None:  # the layer writes the slots' rows, then reads copies
                k_part, v_part = cache.rows(index, 0, cache.num_slots)
            else:
                k_part, v_part = cache.rows(index, first_slot, batch)
                if self.compiled_layers:
                    mark_dynamic(k_part, 0)
                    mark_dynamic(v_part, 0)
            h = step(
                layer,
                h,
                rope,
                k_part,
                v_part,
                positions,
                written,
                packed,
                packing,
                slots,
                mask,
                num_keys,
                fused,
            )
            if index in self.aux_layer_ids:
                saved[index] = h
        # Residual stream after layer i, i.e. HF ``hidden_states[i + 1]`` (dflash's offset 1).
        features = torch.cat([saved[i] for i in self.aux_layer_ids], -1) if saved else h[..., :0]
        return self.norm(h), features

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(hidden, self.lm_head.weight, None, self.gemv)
