"""Per-row sampling distributions and inverse-CDF sampling from given uniforms (pure tensors).

Uniforms come from each request's own generator, so a seeded request samples the same tokens
whatever batch it shares, and nothing here syncs with the host.
"""

from __future__ import annotations

import torch


def sampling_probs(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor
) -> torch.Tensor:
    """logits [B, W, V]; temperature, top_p [B] float; top_k [B] long (0 = off) -> probs [B, W, V].

    Order as ``dflash.model._sampling_probs``: scale by 1/T, keep the top-k, softmax, keep the
    smallest prefix whose mass reaches top_p, renormalise. Rows with T <= 0 get a one-hot at
    the argmax, so greedy rows are the deterministic special case of the same rules.
    """
    vocab = logits.shape[-1]
    is_greedy = (temperature <= 0)[:, None, None]
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scores = logits.float() / scale[:, None, None]
    sorted_scores, order = scores.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)
    kept = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    sorted_scores = sorted_scores.masked_fill(ranks >= kept[:, None, None], float("-inf"))
    sorted_probs = torch.softmax(sorted_scores, dim=-1)
    in_nucleus = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p[:, None, None]
    sorted_probs = sorted_probs * in_nucleus
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    probs = torch.zeros_like(sorted_probs).scatter(-1, order, sorted_probs)
    one_hot = torch.nn.functional.one_hot(logits.argmax(dim=-1), vocab).to(probs.dtype)
    return torch.where(is_greedy, one_hot, probs)


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """probs [..., V] (need not be normalised), uniforms [...] in [0, 1) -> token ids [...].

    Picks the first index whose cumulative mass exceeds u * total: never a zero-mass token."""
    cdf = probs.cumsum(dim=-1)
    threshold = uniforms[..., None] * cdf[..., -1:]
    index = (cdf <= threshold).sum(dim=-1)
    return index.clamp_max(probs.shape[-1] - 1)
