"""The pure verify/sampling functions, case by case."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from engines.embedded.sampling import sample_from_probs, sampling_probs
from engines.embedded.speculative import verify_greedy, verify_rejection


def test_verify_greedy_accepts_matching_prefix_and_returns_bonus() -> None:
    drafts = torch.tensor([[5, 6, 7], [5, 9, 7], [1, 2, 3], [5, 6, 7]])
    num_draft = torch.tensor([3, 3, 3, 1])  # last row is ragged: only its first draft counts
    target = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [4, 2, 3, 8], [5, 6, 7, 8]])
    accepted, bonus = verify_greedy(drafts, num_draft, target)
    assert accepted.tolist() == [
        [True, True, True],
        [True, False, False],
        [False, False, False],
        [True, False, False],
    ]
    assert bonus.tolist() == [8, 6, 4, 6]


def test_verify_greedy_with_no_drafts_is_plain_decode() -> None:
    accepted, bonus = verify_greedy(
        torch.zeros(2, 0, dtype=torch.long), torch.tensor([0, 0]), torch.tensor([[3], [4]])
    )
    assert accepted.shape == (2, 0)
    assert bonus.tolist() == [3, 4]


def test_sampling_probs_top_k_top_p_and_greedy_rows() -> None:
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]] * 3))
    probs = sampling_probs(
        logits,
        torch.tensor([1.0, 1.0, 0.0]),
        torch.tensor([1.0, 0.7, 1.0]),
        torch.tensor([2, 0, 0]),
    )
    torch.testing.assert_close(probs[0, 0], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(probs[1, 0], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert probs[2, 0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_sample_from_probs_never_picks_zero_mass() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]]).expand(5, 4)
    tokens = sample_from_probs(probs, torch.tensor([0.0, 0.25, 0.5, 0.75, 0.9999]))
    assert tokens.tolist() == [1, 1, 3, 3, 3]


def test_rejection_always_accepts_when_draft_equals_target() -> None:
    p = torch.softmax(torch.randn(4, 3, 6, generator=torch.Generator().manual_seed(0)), -1)
    drafts = torch.tensor([[0, 1], [2, 3], [4, 5], [1, 1]])
    accepted, _ = verify_rejection(
        drafts, torch.tensor([2, 2, 2, 2]), p[:, :2], p, torch.rand(4, 2), torch.rand(4)
    )
    assert accepted.all()


def test_rejection_never_accepts_tokens_the_target_cannot_emit() -> None:
    p = torch.tensor([[[0.0, 1.0, 0.0]] * 2])
    q = torch.tensor([[[1.0, 0.0, 0.0]]])
    accepted, bonus = verify_rejection(
        torch.tensor([[0]]), torch.tensor([1]), q, p, torch.tensor([[0.0]]), torch.tensor([0.3])
    )
    assert accepted.tolist() == [[False]]
    assert bonus.tolist() == [1]


def test_rejection_first_token_is_distributed_as_target() -> None:
    """Chi-square: the token emitted at the first drafted position follows p, not q."""
    n, vocab = 40_000, 5
    gen = torch.Generator().manual_seed(1)
    p = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    q = torch.tensor([0.05, 0.1, 0.15, 0.3, 0.4])
    drafts = sample_from_probs(q.expand(n, vocab), torch.rand(n, generator=gen))[:, None]
    accepted, bonus = verify_rejection(
        drafts,
        torch.ones(n, dtype=torch.long),
        q.expand(n, 1, vocab),
        p.expand(n, 2, vocab),
        torch.rand(n, 1, generator=gen),
        torch.rand(n, generator=gen),
    )
    emitted = torch.where(accepted[:, 0], drafts[:, 0], bonus)
    counts = torch.bincount(emitted, minlength=vocab).double()
    assert 0.05 < accepted.float().mean() < 0.95  # both paths were exercised
    assert chisquare(counts.numpy(), (p * n).numpy()).pvalue > 1e-3
