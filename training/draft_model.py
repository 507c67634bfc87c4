"""The DFlash draft in its training form: many blocks per sequence in one masked forward.

Parameter names, shapes and arithmetic match `dflash.model.DFlashDraftModel` (the reference
that `dflash_generate`, the embedded engine and vLLM's `dflash` method load), so the state dict
exports unchanged. tests/training/test_draft_model.py checks the equivalence on one block.

How a block is drafted (dflash_generate): the target has processed positions < a; the anchor
token x[a] (the target's last output) and B-1 mask tokens sit at positions a..a+B-1. Every
draft layer attends, without causal masking, to
  - context keys/values: k_proj/v_proj of hidden_norm(fc(concat of target hidden states at
    target_layer_ids)) for positions < a (dflash's `hidden_states[layer_id + 1]`, i.e. the
    output of decoder layer `layer_id`), and
  - the block's own B tokens.
The output at block slot i >= 1 is the draft's guess for x[a+i], read through the target's LM
head. Training packs `num_anchors` blocks per sequence and expresses "positions < a" and
"same block" as one boolean attention mask.
"""

import torch
from torch import nn
from torch.nn import functional as F
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    rotate_half,
)


class DraftAttention(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.head_dim = int(config.head_dim or config.hidden_size // config.num_attention_heads)
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads or self.num_heads)
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden, context, rope_q, rope_k, mask):
        """hidden (b, q, h) block tokens; context (b, c, h); mask (b, 1, q, c + q) bool."""
        b, q_len, _ = hidden.shape
        q = self.q_norm(self.q_proj(hidden).view(b, q_len, -1, self.head_dim)).transpose(1, 2)
        kv_in = torch.cat([context, hidden], dim=1)
        k = self.k_norm(self.k_proj(kv_in).view(b, kv_in.shape[1], -1, self.head_dim)).transpose(
            1, 2
        )
        v = self.v_proj(kv_in).view(b, kv_in.shape[1], -1, self.head_dim).transpose(1, 2)
        q, k = _rope(q, *rope_q), _rope(k, *rope_k)
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DraftLayer(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.self_attn = DraftAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden, context, rope_q, rope_k, mask):
        hidden = hidden + self.self_attn(
            self.input_layernorm(hidden), context, rope_q, rope_k, mask
        )
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DFlashDraft(nn.Module):
    """State-dict compatible with dflash.model.DFlashDraftModel (no embeddings, no LM head)."""

    def __init__(self, config: Qwen3Config, target_layer_ids: list[int]):
        super().__init__()
        self.config = config
        self.target_layer_ids = list(target_layer_ids)
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.fc = nn.Linear(
            len(target_layer_ids) * config.hidden_size, config.hidden_size, bias=False
        )
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, noise_embedding, target_features, noise_positions, context_positions, mask):
        """noise_embedding (b, q, h): target embeddings of the block tokens (anchor + masks);
        target_features (b, c, n*h): concatenated target hidden states; positions (b, q)/(b, c).
        Returns the normed hidden states (b, q, h); logits come from the target's LM head."""
        context = self.hidden_norm(self.fc(target_features))
        rope_q = self.rotary_emb(noise_embedding, noise_positions)
        rope_k = self.rotary_emb(
            noise_embedding, torch.cat([context_positions, noise_positions], 1)
        )
        hidden = noise_embedding
        for layer in self.layers:
            hidden = layer(hidden, context, rope_q, rope_k, mask)
        return self.norm(hidden)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    return x * cos + rotate_half(x) * sin


def block_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """(b, 1, n*B, context_len + n*B) bool: block j sees context positions < anchors[:, j] and
    all B slots of block j (no causal order inside a block), nothing else."""
    b, n = anchors.shape
    device = anchors.device
    slot_block = torch.arange(n * block_size, device=device) // block_size  # (q,)
    query_anchor = anchors[:, slot_block]  # (b, q)
    context_ok = torch.arange(context_len, device=device)[None, None, :] < query_anchor[:, :, None]
    noise_ok = slot_block[:, None] == slot_block[None, :]
    noise_ok = noise_ok[None].expand(b, -1, -1)
    return torch.cat([context_ok, noise_ok], dim=-1)[:, None]


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """(b, n*B) position ids a_j + i of every block slot."""
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors[:, :, None] + offsets).flatten(1)
