"""Verify drafted tokens against the target (pure tensor functions, no host syncs).

Shapes: B rows, K = the widest draft in the batch; row b drafted ``num_draft[b] <= K`` tokens
(ragged verify) and the rest of its K columns are padding that is never accepted.
``target_*`` has K + 1 positions: position j scores the token after the j-th verified input
(the row's last token, then its drafts).
"""

from __future__ import annotations

import torch

from engines.embedded.sampling import sample_from_probs


def _accepted_prefix(ok: torch.Tensor, num_draft: torch.Tensor) -> torch.Tensor:
    """ok [B, K] -> bool [B, K]: True up to (excluding) the first failure or padding column."""
    columns = torch.arange(ok.shape[1], device=ok.device)
    ok = ok & (columns[None, :] < num_draft[:, None])
    return ok.to(torch.int32).cumprod(dim=1).bool()


def verify_greedy(
    draft_tokens: torch.Tensor, num_draft: torch.Tensor, target_argmax: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens [B, K], num_draft [B], target_argmax [B, K + 1].

    Rule: draft token j is accepted iff all drafts before it were accepted and it equals the
    target's argmax at position j. The target's argmax right after the accepted prefix is the
    bonus token, so the output is exactly target-only greedy decoding.
    Returns (accepted mask [B, K], bonus token [B]); accept length = mask.sum(1) + 1.
    """
    accepted = _accepted_prefix(draft_tokens == target_argmax[:, :-1], num_draft)
    num_accepted = accepted.sum(dim=1)
    bonus = target_argmax.gather(1, num_accepted[:, None])[:, 0]
    return accepted, bonus


def verify_rejection(
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    accept_uniforms: torch.Tensor,
    bonus_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens [B, K] sampled from draft_probs [B, K, V]; target_probs [B, K + 1, V];
    accept_uniforms [B, K], bonus_uniforms [B] in [0, 1).

    Rule (speculative sampling, Leviathan et al. 2023 / Chen et al. 2023): accept draft x_j with
    probability min(1, p_j(x_j) / q_j(x_j)), i.e. iff u_j * q_j(x_j) < p_j(x_j), stopping at the
    first rejection. After a rejection at j the bonus token is drawn from
    normalise(max(p_j - q_j, 0)); if all drafts were accepted it is drawn from p_K. Every emitted
    token is then distributed exactly as the target's (temperature/top-p/top-k) distribution.
    Returns (accepted mask [B, K], bonus token [B]).
    """
    p = target_probs[:, :-1].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    accepted = _accepted_prefix(accept_uniforms * q < p, num_draft)
    num_accepted = accepted.sum(dim=1)
    rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
    p_next = target_probs[rows, num_accepted]  # [B, V]
    q_padded = torch.cat([draft_probs, p_next.new_zeros(p_next.shape)[:, None]], dim=1)
    was_rejected = (num_accepted < num_draft)[:, None]
    q_next = torch.where(was_rejected, q_padded[rows, num_accepted], torch.zeros_like(p_next))
    residual = (p_next - q_next).clamp_min(0)
    has_mass = residual.sum(dim=-1, keepdim=True) > 0
    final = torch.where(has_mass, residual, p_next)
    return accepted, sample_from_probs(final, bonus_uniforms)
