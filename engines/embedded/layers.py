"""Building blocks shared by the target and the draft: RMSNorm, RoPE, one decoder layer's weights,
cached attention. Parameter names follow the Hugging Face checkpoints so ``load_state_dict`` maps
one to one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engines.embedded.checkpoint import ModelShape
from engines.embedded.decode_attention import (
    MAX_SPLITS,
    grouped_decode_attention,
    packed_decode_attention,
)
from engines.embedded.gemv import linear
from engines.embedded.packing import Packing


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise (fp32 accumulation), cast back, then scale by the weight: transformers'
        # Qwen3 order. F.rms_norm is one fused kernel on CUDA.
        return F.rms_norm(x, (x.shape[-1],), eps=self.eps) * self.weight


class Rotary(nn.Module):
    """Default RoPE; cos/sin tables for every position up to ``max_positions``."""

    def __init__(self, head_dim: int, theta: float, max_positions: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        freqs = torch.arange(max_positions).float()[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_positions, head_dim]
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos, signed sin [B, W, 1, head_dim] for positions [B, W]; computed once per
        forward. The sin table's first half is negated, so ``rotate`` needs no negation
        (``-a * s == a * -s`` exactly: the result is bit for bit the rotate-half formula's)."""
        cos = self.cos[positions].to(dtype)[:, :, None, :]
        sin = self.sin[positions].to(dtype)[:, :, None, :]
        half = sin.shape[-1] // 2
        return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)

    @staticmethod
    def rotate(x: torch.Tensor, tables: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """x: [B, W, heads, head_dim] -> x rotated (rotate-half convention): four kernels
        (roll, two products, a sum) where cat([-x2, x1]) took five."""
        cos, signed_sin = tables
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class SelfAttentionWeights(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        hd, bias, hidden = shape.head_dim, shape.attention_bias, shape.hidden_size
        self.q_proj = nn.Linear(hidden, shape.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(hidden, shape.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(hidden, shape.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(shape.num_heads * hd, hidden, bias=bias)
        self.q_norm = RMSNorm(hd, shape.rms_norm_eps) if shape.has_qk_norm else nn.Identity()
        self.k_norm = RMSNorm(hd, shape.rms_norm_eps) if shape.has_qk_norm else nn.Identity()


class MLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)


class DecoderLayer(nn.Module):
    """Weights of one Qwen3/Llama decoder layer (the draft's layers have the same names)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = shape.num_heads, shape.num_kv_heads
        self.head_dim = shape.head_dim
        self.self_attn = SelfAttentionWeights(shape)
        self.mlp = MLP(shape)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        # Linear layers through gemv.small_linear (few-token steps; ModelRunner(linear="gemv"
        # or "fused"; the forwards decide per step whether the norms and adds are fused).
        self.gemv = False
        # Set by fuse() after loading.
        self.qkv_weight: torch.Tensor
        self.qkv_bias: torch.Tensor | None
        self.gate_up_weight: torch.Tensor
        self.qk_norm_weight: torch.Tensor | None
        self.eps = shape.rms_norm_eps

    def fuse(self) -> None:
        """Concatenate q/k/v and gate/up weights (one GEMM each), and the q and k norms'
        weights per head (both normed in one kernel); drop the separate copies.

        Called once after loading: fewer, larger kernels matter at batch 1 decode."""
        attn, mlp = self.self_attn, self.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        weight = torch.cat([p.weight.detach() for p in projections])
        biases = [p.bias.detach() for p in projections if p.bias is not None]
        self.register_buffer("qkv_weight", weight, persistent=False)
        self.register_buffer("qkv_bias", torch.cat(biases) if biases else None, persistent=False)
        gate_up = torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()])
        self.register_buffer("gate_up_weight", gate_up, persistent=False)
        norm_weight = None
        if isinstance(attn.q_norm, RMSNorm) and isinstance(attn.k_norm, RMSNorm):
            q_weight = attn.q_norm.weight.detach().expand(self.num_heads, -1)
            k_weight = attn.k_norm.weight.detach().expand(self.num_kv_heads, -1)
            norm_weight = torch.cat([q_weight, k_weight])  # [heads + kv_heads, head_dim]
        self.register_buffer("qk_norm_weight", norm_weight, persistent=False)
        del attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj

    def qkv(
        self, h: torch.Tensor, rope: tuple[torch.Tensor, ...] | None = None, fused: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: [B, W, hidden] (the residual stream: input-normed here) -> q [B, W, heads, hd],
        k, v [B, W, kv_heads, hd]; q and k normed, and rotated by ``rope``
        (``Rotary.tables``) when given. q and k are normed and rotated together (one tensor
        of heads + kv_heads per token: the same values, half the kernels). ``fused``: the
        input norm inside the projection's kernel (``gemv.linear``)."""
        hd = self.head_dim
        heads = self.num_heads + self.num_kv_heads
        norm = self.input_layernorm
        if fused:
            out = linear(h, self.qkv_weight, self.qkv_bias, fused=True, **_normed(norm))
        else:
            out = linear(norm(h), self.qkv_weight, self.qkv_bias, self.gemv)
        b, w = h.shape[:2]
        qk = out[..., : heads * hd].view(b, w, heads, hd)
        if self.qk_norm_weight is not None:
            # transformers' Qwen3 order: normalise (fp32 accumulation), cast back, scale.
            qk = F.rms_norm(qk, (hd,), eps=self.eps) * self.qk_norm_weight
        if rope is not None:
            qk = Rotary.rotate(qk, rope)
        v = out[..., heads * hd :].view(b, w, self.num_kv_heads, hd)
        return qk[:, :, : self.num_heads], qk[:, :, self.num_heads :], v

    def key_value(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, W, hidden] -> k (normed, before RoPE), v [B, W, kv_heads, head_dim]."""
        q_size = self.num_heads * self.head_dim
        bias = None if self.qkv_bias is None else self.qkv_bias[q_size:]
        k, v = linear(x, self.qkv_weight[q_size:], bias, self.gemv).chunk(2, dim=-1)
        b, w = x.shape[:2]
        k = self.self_attn.k_norm(k.reshape(b, w, self.num_kv_heads, self.head_dim))
        return k, v.reshape(b, w, self.num_kv_heads, self.head_dim)

    def attention_residual(
        self, h: torch.Tensor, attn: torch.Tensor, fused: bool = False
    ) -> torch.Tensor:
        """h + o_proj(attn): the residual stream after the attention block (``fused``: the
        add inside the projection's kernel)."""
        o_proj = self.self_attn.o_proj
        return linear(attn, o_proj.weight, o_proj.bias, self.gemv, fused, residual=h)

    def feed_forward(self, h: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """Residual MLP block: h + down(silu(gate(x)) * up(x)), x = post_attention_layernorm(h).
        ``fused``: the norm inside the gate/up projection's kernel, the SiLU gate and the
        residual add inside the down projection's."""
        norm = self.post_attention_layernorm
        if fused:
            gate_up = linear(h, self.gate_up_weight, None, fused=True, **_normed(norm))
        else:
            gate_up = linear(norm(h), self.gate_up_weight, None, self.gemv)
        down = self.mlp.down_proj.weight
        return linear(gate_up, down, None, self.gemv, fused, residual=h, act=True)


def _normed(norm: RMSNorm) -> dict[str, Any]:
    """``gemv.linear``'s arguments for an input normed by ``norm``."""
    return {"norm_weight": norm.weight, "eps": norm.eps}


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], role: str) -> None:
    """``load_state_dict`` that fails with the first missing and unexpected names, so a
    mismatched checkpoint says which tensors it lacks or has too many of."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{role} weights do not match the config: missing={missing[:5]}, "
            f"unexpected={unexpected[:5]}"
        )


def decoder_layers(layers: nn.ModuleList) -> list[DecoderLayer]:
    """Typed view of a ModuleList of decoder layers."""
    return [layer for layer in layers if isinstance(layer, DecoderLayer)]


def cache_rows(positions: torch.Tensor, slots: torch.Tensor | None = None) -> torch.Tensor:
    """The cache row each of ``positions`` [B, W] writes: b, or ``slots[b]``. Built once per
    forward and passed to every layer's ``write_cache`` (an index kernel fewer per write)."""
    if slots is None:
        return torch.arange(positions.shape[0], device=positions.device)[:, None].expand_as(
            positions
        )
    return slots[:, None].expand_as(positions)


def write_cache(
    cache: torch.Tensor,
    positions: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> None:
    """cache: [B, kv_heads, L, head_dim] (rows of the batch); positions: [B, W];
    values: [B, W, kv_heads, head_dim]. Writes each row's values at its positions.
    ``slots`` [B] (a device tensor, so a CUDA graph can take it as an input): ``cache`` is
    then every slot of the layer and row b writes slot ``slots[b]``. ``rows``: the forward's
    ``cache_rows(positions, slots)``, when it has them."""
    if rows is None:
        rows = cache_rows(positions, slots)
    cache[rows, :, positions] = values


def write_cache_at(
    cache: torch.Tensor, slots: tuple[torch.Tensor, torch.Tensor], values: torch.Tensor
) -> None:
    """Packed writes: ``slots`` = (rows [N], positions [N]) from ``Packing.cache_slots``;
    values [1, N, kv_heads, head_dim]."""
    rows, positions = slots
    cache[rows, :, positions] = values[0]


def attention_mask(visible: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """visible [B, W, L] bool -> the grouped mask [B, 1, group * W, L] ``cached_attention`` takes
    (built once per forward, shared by all layers)."""
    b, w, length = visible.shape
    group = num_heads // num_kv_heads
    return visible[:, None, None].expand(b, 1, group, w, length).reshape(b, 1, group * w, length)


def cached_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: AttentionMask
) -> torch.Tensor:
    """q: [B, W, heads, D]; k/v_cache: [B, kv_heads, L, D]; mask from ``attention_mask``.

    Grouped-query attention without copying K/V: each kv head's query group is folded into the
    query length, so one attention call reads every cached key once. Returns [B, W, heads * D].
    """
    b, w, h, d = q.shape
    kvh = k_cache.shape[1]
    g = h // kvh
    q = q.view(b, w, kvh, g, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * w, d)
    out = grouped_attention(q, k_cache, v_cache, mask)
    return out.view(b, kvh, g, w, d).permute(0, 3, 1, 2, 4).reshape(b, w, h * d)


def grouped_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: AttentionMask
) -> torch.Tensor:
    """q already grouped: [B, kv_heads, group * W, D] (``cached_attention``'s layout, which
    ``Packing.grouped_queries`` writes directly); returns the output in that layout.
    ``mask``: a dense mask (``attention_mask``: SDPA) or ``KeyPositions`` (the split-KV
    Triton kernel, decode_attention.py)."""
    if isinstance(mask, KeyPositions):
        return grouped_decode_attention(q, k_cache, v_cache, mask.positions)
    return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)


class KeyPositions(NamedTuple):
    """The causal mask as the Triton attention takes it (``TargetModel.attention ==
    "triton"``): key j is visible to column c of row b iff j <= positions[b, c] — the same
    mask ``attention_mask`` builds densely, without the [B, group * W, keys] tensor. On a
    packed forward ``tokens`` (``Packing.token_map``) says where each (row, column)'s query is
    among the packed tokens, and ``packed_attention`` reads them there."""

    positions: torch.Tensor  # [B, W]
    tokens: torch.Tensor | None = None  # [B, W] packed index, -1: none


def packed_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: KeyPositions
) -> torch.Tensor:
    """Packed queries [1, N, heads, D] (strided views fine) of a ragged step -> [1, N, heads *
    D], the Triton attention reading and writing the packed tokens where they are (no
    grouped-layout scatter and gather). ``mask.tokens`` is required."""
    assert mask.tokens is not None
    out = packed_decode_attention(q[0], k_cache, v_cache, mask.positions, mask.tokens)
    return out.view(1, out.shape[0], -1)


AttentionMask = torch.Tensor | KeyPositions


def check_grouped_attention(
    num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device, dtype: torch.dtype
) -> float:
    """Start-up check of the Triton attention on this device (``ModelRunner(attention=
    "triton")``): random steps of the model's head layout (one row at width 1 over several
    splits, three rows at width 16 in one split, and a ragged step's packed tokens) against
    SDPA with ``attention_mask``'s dense mask. Returns the largest difference; raises
    ``RuntimeError`` naming the case when a kernel fails to build or run, or differs by more
    than bf16 rounding allows."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    group = num_heads // num_kv_heads
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    worst = 0.0
    for batch, width, keys, most in ((1, 1, 300, MAX_SPLITS), (3, 16, 200, 1), (3, 16, 200, 0)):
        packed = most == 0  # rows of 16, 5 and 1 tokens packed, read in place
        case = f"{batch} rows x width {width}, {keys} keys, " + (
            "packed tokens" if packed else f"at most {most} splits"
        )
        k, v = (
            torch.randn(batch, num_kv_heads, keys, head_dim, generator=gen).to(device, dtype)
            for _ in "kv"
        )
        last = torch.randint(width - 1, keys, (batch, 1), generator=gen)
        positions = (last - width + 1 + torch.arange(width)).to(device)
        visible = torch.arange(keys, device=device)[None, None, :] <= positions[:, :, None]
        mask = attention_mask(visible, num_heads, num_kv_heads)
        if packed:
            packing = Packing.from_lengths(torch.tensor([width, 5, 1], device=device), width)
            q = torch.randn(packing.num_tokens, num_heads, head_dim, generator=gen)
            q = q.to(device, dtype)
            padded = packing.unpack(q[None])  # zeros where a row has no token
            want = packing.pack(cached_attention(padded, k, v, mask))[0].float()
        else:
            q = torch.randn(batch, num_kv_heads, group * width, head_dim, generator=gen)
            q = q.to(device, dtype)
            want = grouped_attention(q, k, v, mask).float()
        try:
            if packed:
                got = packed_decode_attention(q, k, v, positions, packing.token_map())
                got = got.float().view(got.shape[0], -1)
            else:
                got = grouped_decode_attention(q, k, v, positions, most).float()
        except Exception as exc:
            raise RuntimeError(
                f"attention: triton failed on {device} ({case}): {exc!r}; use attention: sdpa"
            ) from exc
        diff = float((got - want).abs().max())
        if not diff <= tolerance:  # NaN fails too
            raise RuntimeError(
                f"attention: triton differs from SDPA by {diff:.3g} on {device} ({case}; "
                f"tolerance {tolerance}); use attention: sdpa"
            )
        worst = max(worst, diff)
    return worst
