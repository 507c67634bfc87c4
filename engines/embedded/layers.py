"""Building blocks shared by the target and the draft: RMSNorm, RoPE, one decoder layer's weights,
cached attention. Parameter names follow the Hugging Face checkpoints so ``load_state_dict`` maps
one to one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engines.embedded.checkpoint import ModelShape


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and cast back before the weight, exactly as transformers' Qwen3.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


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

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [B, W, heads, head_dim]; positions: [B, W]."""
        cos = self.cos[positions].to(x.dtype)[:, :, None, :]
        sin = self.sin[positions].to(x.dtype)[:, :, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, W, hidden] (already input-normed) -> q [B, W, heads, head_dim], before RoPE."""
        q = self.self_attn.q_proj(x).view(*x.shape[:2], self.num_heads, self.head_dim)
        return self.self_attn.q_norm(q)

    def key_value(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, W, hidden] -> k, v [B, W, kv_heads, head_dim], k before RoPE."""
        k = self.self_attn.k_proj(x).view(*x.shape[:2], self.num_kv_heads, self.head_dim)
        v = self.self_attn.v_proj(x).view(*x.shape[:2], self.num_kv_heads, self.head_dim)
        return self.self_attn.k_norm(k), v

    def attention_out(self, attn: torch.Tensor) -> torch.Tensor:
        return self.self_attn.o_proj(attn)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        """Residual MLP block: h + mlp(post_attention_layernorm(h))."""
        return h + self.mlp(self.post_attention_layernorm(h))


def decoder_layers(layers: nn.ModuleList) -> list[DecoderLayer]:
    """Typed view of a ModuleList of decoder layers."""
    return [layer for layer in layers if isinstance(layer, DecoderLayer)]


def write_cache(cache: torch.Tensor, positions: torch.Tensor, values: torch.Tensor) -> None:
    """cache: [B, kv_heads, L, head_dim] (rows of the batch); positions: [B, W];
    values: [B, W, kv_heads, head_dim]. Writes each row's values at its positions."""
    rows = torch.arange(cache.shape[0], device=cache.device)[:, None].expand_as(positions)
    cache[rows, :, positions] = values


def cached_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """q: [B, W, heads, D]; k/v_cache: [B, kv_heads, L, D]; visible: [B, W, L] bool.

    Grouped-query attention without copying K/V: each kv head's query group is folded into the
    query length, so one SDPA call reads every cached key once. Returns [B, W, heads * D].
    """
    b, w, h, d = q.shape
    kvh, length = k_cache.shape[1], k_cache.shape[2]
    g = h // kvh
    q = q.view(b, w, kvh, g, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * w, d)
    mask = visible[:, None, None].expand(b, 1, g, w, length).reshape(b, 1, g * w, length)
    out = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
    return out.view(b, kvh, g, w, d).permute(0, 3, 1, 2, 4).reshape(b, w, h * d)
