"""Speculative sampling emits the target's distribution at every position of a block.

Why a position-wise test is exact: in a step, draft token j is proposed from what precedes it
and tested with its own uniform, whatever happened at positions 1..j-1, so given the tokens
before it and that the step reached position j, the token emitted there (an accepted draft, the
residual resample after a rejection, or the bonus after a fully accepted block) follows the
target's p(. | tokens before it). So every emitted token is tested against its own exact
conditional, one Pearson chi-square per block position (1..8 for block 8, the 8th being the
bonus after 7 accepted drafts) and one for the bonus after a fully accepted block of any k.
Tokens that share a conditional (the chain's context token) form a group and groups add their
statistics; where every prefix differs (the engine) the expected counts are the sum of the
conditionals, which makes the statistic conservative (its covariance is below the multinomial
one). Given the rejection, a resample is not p-distributed, so it is only tested in its pool.

Significance: ALPHA = 1e-6 per chi-square, ~60 of them in the module, so were the seeds
changed a false failure would have probability < 1e-4; with the fixed seeds every run is
identical (measured p-values of the correct rule: 0.01-0.97). Power, asserted in the module:
the same statistics on deliberately wrong rules (acceptance with min(1, q/p); a rejection
resampled from p instead of normalise(max(p - q, 0)); the bonus after a fully accepted block
drawn from the last draft position; a target missing its top-k) fail with p-values below
1e-50 (measured values next to the tests).

1. Pure functions (``verify_rejection``, ``sampling_probs``, ``sample_from_probs``) on a Markov
   chain over 6 tokens whose conditionals are known exactly: 60,000 rows of a block-8 step
   (half k = 7, half ragged with k in 0..7), at temperature 1, with top-k, top-p and both.
2. The engine on the tiny agreeing pair (temperature 0.7, top-k 4, top-p 0.95; top-k changes
   93% of the conditionals, top-p 83%): 256 seeded requests of 48 tokens, k = 7 or random per
   step (packed ragged rows), 64 at a time with the rest joining as others finish; every token
   is checked against the target's conditional from ``transformers`` (teacher forcing of the
   request's own tokens) truncated here in numpy. Counts per block position 1..8: 4284, 2977,
   1842, 1156, 745, 498, 319, 211.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import torch
from scipy.stats import chi2

import engines.embedded.runner as runner_module
from engines.embedded.events import RequestView, SamplingParams
from engines.embedded.request import Request
from engines.embedded.sampling import sample_from_probs, sampling_probs
from engines.embedded.speculative import verify_rejection
from tests.engines.embedded.conftest import make_engine, random_prompt

transformers = pytest.importorskip("transformers")

ALPHA = 1e-6
MIN_EXPECTED = 5.0  # cells expecting fewer counts are pooled into one
Verify = Callable[..., tuple[torch.Tensor, torch.Tensor]]
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Params:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


def truncated(logits: Floats, params: Params) -> Floats:
    """The target's sampling distribution, written independently of ``sampling_probs``: scale by
    1/T, keep the top-k, softmax, keep the fewest tokens whose mass reaches top_p, renormalise.
    logits [..., V] -> probs [..., V] (float64)."""
    order = np.argsort(-logits, axis=-1, kind="stable")
    scores = np.take_along_axis(logits.astype(np.float64), order, -1) / params.temperature
    if params.top_k:
        scores[..., params.top_k :] = -np.inf
    probs = np.exp(scores - scores[..., :1])
    probs /= probs.sum(-1, keepdims=True)
    cumulative = np.cumsum(probs, -1)
    num_kept = (cumulative < params.top_p).sum(-1, keepdims=True) + 1  # first to reach top_p
    probs *= np.arange(probs.shape[-1]) < num_kept
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(probs)
    np.put_along_axis(out, order, probs, -1)
    return out


def pearson_statistic(tokens: npt.NDArray[np.int64], expected: Floats) -> tuple[float, int]:
    """tokens [n] emitted, expected [n, V] each one's exact distribution -> (Pearson statistic,
    degrees of freedom); cells expecting < MIN_EXPECTED are pooled; inf for a token that had
    probability 0."""
    observed = np.bincount(tokens, minlength=expected.shape[1]).astype(np.float64)
    mass = expected.sum(0)
    if observed[mass == 0].any():
        return np.inf, 1
    big = mass >= MIN_EXPECTED
    cells_o = np.array([*observed[big], observed[~big].sum()])
    cells_e = np.array([*mass[big], mass[~big].sum()])
    used = cells_e > 0
    stat = float(((cells_o[used] - cells_e[used]) ** 2 / cells_e[used]).sum())
    return stat, int(used.sum()) - 1


@dataclass
class Samples:
    """Emitted tokens with their exact distributions, by label (block position, bonus) and
    group. Groups share one exact distribution (the chain's context token) and add their
    statistics, which is sharper than pooling them; the engine's prefixes are all distinct,
    so there every token is one pool (conservative: see the module docstring)."""

    tokens: dict[str, list[npt.NDArray[np.int64]]] = field(default_factory=dict)
    expected: dict[str, list[Floats]] = field(default_factory=dict)
    groups: dict[str, list[npt.NDArray[np.int64]]] = field(default_factory=dict)
    num_rejected: int = 0  # steps that ended on a rejection (resampled from the residual)

    def add(
        self, label: str, tokens: npt.ArrayLike, expected: Floats, groups: npt.ArrayLike = 0
    ) -> None:
        """tokens [n], expected [n, V], groups [n] or one for all."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self.tokens.setdefault(label, []).append(tokens)
        self.expected.setdefault(label, []).append(expected)
        group_ids = np.broadcast_to(np.asarray(groups, dtype=np.int64), tokens.shape)
        self.groups.setdefault(label, []).append(group_ids)

    def count(self, label: str) -> int:
        return sum(len(chunk) for chunk in self.tokens.get(label, []))

    def exact(self, label: str) -> Floats:
        return np.concatenate(self.expected[label])

    def pvalue(self, label: str) -> float:
        tokens, exact = np.concatenate(self.tokens[label]), self.exact(label)
        groups = np.concatenate(self.groups[label])
        stats = [pearson_statistic(tokens[groups == g], exact[groups == g]) for g in set(groups)]
        return float(chi2.sf(sum(s for s, _ in stats), max(1, sum(d for _, d in stats))))

    def pvalues(self) -> dict[str, float]:
        return {label: self.pvalue(label) for label in self.tokens}


# -- deliberately wrong rules (the power check) ------------------------------------------------


def wrong_rule(bug: str) -> Verify:
    """``verify_rejection`` with one deliberate bug; same signature. Bugs: ``swapped_ratio``
    (accept with min(1, q/p)), ``resample_from_target`` (after a rejection draw from p, not
    normalise(max(p - q, 0))), ``bonus_off_by_one`` (after a fully accepted block draw from
    the last draft position's p instead of the next one's)."""

    def verify(
        drafts: torch.Tensor,
        num_draft: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        accept_u: torch.Tensor,
        bonus_u: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        p = target_probs[:, :-1].gather(-1, drafts[..., None])[..., 0]
        q = draft_probs.gather(-1, drafts[..., None])[..., 0]
        ok = accept_u * p < q if bug == "swapped_ratio" else accept_u * q < p
        columns = torch.arange(drafts.shape[1])
        accepted = (ok & (columns < num_draft[:, None])).int().cumprod(1).bool()
        num_accepted = accepted.sum(1)
        rows = torch.arange(drafts.shape[0])
        was_rejected = num_accepted < num_draft
        position = num_accepted
        if bug == "bonus_off_by_one":
            position = torch.where(was_rejected, num_accepted, (num_accepted - 1).clamp_min(0))
        p_next = target_probs[rows, position]
        q_padded = torch.cat([draft_probs, torch.zeros_like(p_next)[:, None]], 1)
        q_next = torch.where(was_rejected[:, None], q_padded[rows, num_accepted], 0.0)
        residual = p_next if bug == "resample_from_target" else (p_next - q_next).clamp_min(0)
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
        return accepted, sample_from_probs(residual, bonus_u)

    return verify


# -- 1. the pure functions on a Markov chain --------------------------------------------------

VOCAB, NUM_SPEC = 6, 7  # block 8
NUM_ROWS = 60_000
CHAIN_PARAMS = {
    "temperature 1": Params(),
    "top-k 3, temperature 0.8": Params(temperature=0.8, top_k=3),
    "top-p 0.8, temperature 1.3": Params(temperature=1.3, top_p=0.8),
    "top-k 4 + top-p 0.85": Params(top_p=0.85, top_k=4),
}


def engine_probs(logits: torch.Tensor, params: Params) -> torch.Tensor:
    """``sampling_probs`` with the same params on every row: [n, W, V] -> [n, W, V]."""
    n = logits.shape[0]
    return sampling_probs(
        logits,
        torch.full((n,), params.temperature),
        torch.full((n,), params.top_p),
        torch.full((n,), params.top_k, dtype=torch.long),
    )


def chain_logits() -> tuple[torch.Tensor, torch.Tensor]:
    """[V, V] target and draft logits of a Markov chain (row a: the token after a). The draft is
    close to the target, so blocks are often accepted deep, and differs enough to reject."""
    gen = torch.Generator().manual_seed(0)
    target = 1.5 * torch.randn(VOCAB, VOCAB, generator=gen)
    return target, target + 0.6 * torch.randn(VOCAB, VOCAB, generator=gen)


def chain_samples(
    verify: Verify, params: Params, *, target_probs_params: Params | None = None
) -> Samples:
    """One speculative step of NUM_ROWS rows (half with k = 7, half ragged with k in 0..7) from
    random last tokens; each emitted token labelled by block position and paired with the
    chain's exact conditional. ``target_probs_params`` overrides what the verifier is given as
    the target (the untruncated-target bug); the expectation always uses ``params``."""
    gen = torch.Generator().manual_seed(1)
    target_logits, draft_logits = chain_logits()
    n = NUM_ROWS
    is_ragged = torch.arange(n) % 2 == 1
    num_draft = torch.where(
        is_ragged, torch.randint(0, NUM_SPEC + 1, (n,), generator=gen), NUM_SPEC
    )
    tokens = [torch.randint(0, VOCAB, (n,), generator=gen)]
    draft_probs = []
    for _ in range(NUM_SPEC):  # x_j ~ q(. | x_{j-1})
        q = engine_probs(draft_logits[tokens[-1]][:, None], params)[:, 0]
        draft_probs.append(q)
        tokens.append(sample_from_probs(q, torch.rand(n, generator=gen)))
    context = torch.stack(tokens, 1)  # [n, K + 1]: last token, then the drafts
    accepted, bonus = verify(
        context[:, 1:],
        num_draft,
        torch.stack(draft_probs, 1),
        engine_probs(target_logits[context], target_probs_params or params),
        torch.rand(n, NUM_SPEC, generator=gen),
        torch.rand(n, generator=gen),
    )
    num_accepted = accepted.sum(1)
    exact = truncated(target_logits.double().numpy(), params)  # [V, V]
    samples = Samples()
    for j in range(1, NUM_SPEC + 2):  # block position j; its context is token j - 1
        reached = (num_accepted >= j - 1) & (num_draft >= j - 1)
        emitted = torch.where(num_accepted >= j, context[:, min(j, NUM_SPEC)], bonus)[reached]
        before = context[reached, j - 1]
        samples.add(f"position {j}", emitted, exact[before], before)
    # After a fully accepted block (k drafts, any k) the bonus is p's at position k + 1. (A
    # resample after a rejection is not p-distributed given the rejection, only within its
    # position's pool above.)
    is_full = num_accepted == num_draft
    last = context[torch.arange(n), num_accepted]
    samples.add("bonus after full block", bonus[is_full], exact[last[is_full]], last[is_full])
    is_full_7 = is_full & (num_draft == NUM_SPEC)
    samples.add(
        "bonus after full k=7 block", bonus[is_full_7], exact[last[is_full_7]], last[is_full_7]
    )
    samples.num_rejected = int((~is_full).sum())
    return samples


@pytest.mark.parametrize("name", CHAIN_PARAMS)
def test_verify_rejection_follows_the_target_at_every_block_position(name: str) -> None:
    samples = chain_samples(verify_rejection, CHAIN_PARAMS[name])
    pvalues = samples.pvalues()
    assert min(pvalues.values()) > ALPHA, pvalues
    # Every position, both ways out of a block, and deep blocks are exercised.
    assert samples.count(f"position {NUM_SPEC + 1}") > 2000, samples.count("position 8")
    assert samples.num_rejected > 10_000 and samples.count("bonus after full block") > 10_000


# Measured p-values (seeded, so every run gives these; 0.0 is below float range):
#   swapped_ratio: 0.0 at positions 1-7 (both params); the bonus after a full block is
#     untouched by this bug (0.63, 0.79)
#   resample_from_target: 0.0 at position 1, 1e-241 .. 1e-58 at positions 2-7
#   bonus_off_by_one: 1e-218 .. 1e-148 at positions 2-7 (ragged blocks end there), 0.0 at
#     position 8 and for the bonus after a full block
#   untruncated target: 0.0 everywhere (tokens outside the top-k)
@pytest.mark.parametrize(
    ("bug", "name"),
    [
        ("swapped_ratio", "temperature 1"),
        ("resample_from_target", "temperature 1"),
        ("bonus_off_by_one", "temperature 1"),
        ("swapped_ratio", "top-k 4 + top-p 0.85"),
    ],
)
def test_a_wrong_rule_fails_the_same_statistics(bug: str, name: str) -> None:
    pvalues = chain_samples(wrong_rule(bug), CHAIN_PARAMS[name]).pvalues()
    assert min(pvalues.values()) < ALPHA, pvalues


def test_an_untruncated_target_fails_the_same_statistics() -> None:
    """A verifier handed the target without top-k (drafts still top-k) emits outside it."""
    params = CHAIN_PARAMS["top-k 3, temperature 0.8"]
    plain = Params(temperature=params.temperature)
    pvalues = chain_samples(verify_rejection, params, target_probs_params=plain).pvalues()
    assert min(pvalues.values()) < ALPHA, pvalues


# -- 2. through the engine ----------------------------------------------------------------------

ENGINE_PARAMS = Params(temperature=0.7, top_p=0.95, top_k=4)
NUM_REQUESTS, NEW_TOKENS, BLOCK_SIZE = 256, 48, 8


def controller(i: int) -> Callable[[RequestView], int]:
    """Three in four requests k = 7 every step; the others k drawn per step in 0..7 (seeded),
    so steps mix k (packed ragged rows)."""
    if i % 4:
        return lambda view: BLOCK_SIZE - 1
    rng = random.Random(i)
    return lambda view: rng.randint(0, BLOCK_SIZE - 1)


def run_seeded_requests(pair: tuple[Path, Path]) -> tuple[list[list[int]], list[Request]]:
    engine = make_engine(pair, max_batch_size=64, max_seq_len=128)
    prompts = [random_prompt(100 + i % 8, 10) for i in range(NUM_REQUESTS)]
    params = SamplingParams(
        max_new_tokens=NEW_TOKENS,
        temperature=ENGINE_PARAMS.temperature,
        top_p=ENGINE_PARAMS.top_p,
        top_k=ENGINE_PARAMS.top_k,
    )
    requests = [
        Request(str(i), p, dataclasses.replace(params, seed=i), controller(i), {})
        for i, p in enumerate(prompts)
    ]
    for request in requests:
        engine.add(request)
    while engine.has_work:
        engine.step()
    return prompts, requests


def engine_samples(pair: tuple[Path, Path]) -> tuple[Samples, dict[str, float]]:
    """Every emitted token labelled by its block position in its step, with the target's exact
    conditional (teacher forcing of the request's own tokens); and how often each truncation
    changed that conditional: top-k (top-p alone would keep more than top_k tokens) and top-p
    (fewer than top_k tokens kept)."""
    prompts, requests = run_seeded_requests(pair)
    model = transformers.AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32)
    samples, nucleus_sizes, kept_sizes = Samples(), [], []
    top_p_only = dataclasses.replace(ENGINE_PARAMS, top_k=0)
    with torch.no_grad():
        for prompt, request in zip(prompts, requests, strict=True):
            out = request.output_ids
            logits = model.eval()(torch.tensor([prompt + out[:-1]])).logits[0, len(prompt) - 1 :]
            exact = truncated(logits.double().numpy(), ENGINE_PARAMS)  # [len(out), V]
            nucleus_sizes.append((truncated(logits.double().numpy(), top_p_only) > 0).sum(-1))
            kept_sizes.append((exact > 0).sum(-1))
            samples.add("prefill", out[:1], exact[:1])
            t = 1  # out[0] came from the prefill
            for k, length in zip(request.spec_tokens, request.accept_lengths, strict=True):
                for j in range(1, length + 1):  # block position j of this step
                    samples.add(f"position {j}", out[t : t + 1], exact[t : t + 1])
                    if j == k + 1 and k > 0:
                        samples.add("bonus after full block", out[t : t + 1], exact[t : t + 1])
                    t += 1
    top_k = ENGINE_PARAMS.top_k
    binding = {
        "top-k": float((np.concatenate(nucleus_sizes) > top_k).mean()),
        "top-p": float((np.concatenate(kept_sizes) < top_k).mean()),
    }
    return samples, binding


def test_engine_sampling_follows_the_target_at_every_block_position(
    agreeing_pair: tuple[Path, Path],
) -> None:
    samples, binding = engine_samples(agreeing_pair)
    pvalues = samples.pvalues()
    assert min(pvalues.values()) > ALPHA, pvalues
    assert samples.count("position 8") > 200, samples.count("position 8")  # 7 drafts accepted
    assert binding["top-k"] > 0.3 and binding["top-p"] > 0.3, binding


# Measured with the swapped rule: p-values 3e-206 (position 1), 7e-302, 2e-289, 1e-286,
# 7e-287, 2e-295, 2e-184 (position 7); the bonus after a full block is untouched by it (0.69).
def test_engine_with_a_wrong_rule_fails_the_same_statistics(
    agreeing_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "verify_rejection", wrong_rule("swapped_ratio"))
    pvalues = engine_samples(agreeing_pair)[0].pvalues()
    assert min(pvalues.values()) < ALPHA, pvalues


def test_the_reference_truncation_agrees_with_sampling_probs() -> None:
    """The expectations above use ``truncated``; the engine samples with ``sampling_probs``."""
    logits = torch.randn(200, 1, 50, generator=torch.Generator().manual_seed(2)) * 2
    for params in [*CHAIN_PARAMS.values(), ENGINE_PARAMS]:
        got = engine_probs(logits, params).double().numpy()
        np.testing.assert_allclose(got, truncated(logits.numpy(), params), atol=1e-6)
