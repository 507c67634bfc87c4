"""Speculative sampling emits the target's distribution at every position of a block.

Why a position-wise test is exact: in a step, draft token j is sampled from q_j and tested with
its own uniform, independently of how positions 1..j-1 fared, so given the tokens before it and
that the step reached position j, the token emitted there (an accepted draft, or the residual
resample after a rejection, or the bonus after a fully accepted block) must follow the
target's p(. | tokens before it). Each test pools every token emitted at one block position
into one Pearson chi-square against the sum of those conditionals (rows with different
conditionals make the statistic conservative: its covariance is below the multinomial one).

Significance: ALPHA = 1e-6 per chi-square, about 60 of them here, so were the seeds changed a
false failure would have probability < 1e-4; with the fixed seeds every run is identical.
Power: the same statistics computed on deliberately wrong rules (acceptance with min(1, q/p),
a rejection resampled from p instead of the residual, the bonus after a fully accepted block
drawn from the last draft position, a target without top-k/top-p) fail with p-values below
1e-30 (the tests assert < ALPHA; measured values are in the comments).

1. Pure functions (``verify_rejection``, ``sampling_probs``, ``sample_from_probs``) on a Markov
   chain over 6 tokens whose conditionals are known exactly: 60,000 rows of a block-8 step
   (k = 7; half the rows ragged with k in 0..7), at temperature 1 and with top-k, top-p and both.
2. The engine on the tiny agreeing pair (temperature 0.7, top-k 4, top-p 0.95): 256 seeded
   requests of 48 tokens, k = 7 or random per step, through continuous batching; every emitted
   token is checked against the target's conditional from ``transformers`` (teacher forcing of
   the request's own tokens) with the truncation computed here in numpy.
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


def pearson_pvalue(tokens: npt.NDArray[np.int64], expected: Floats) -> float:
    """tokens [n] emitted, expected [n, V] each one's exact distribution -> chi-square p-value
    (0.0 if a token had probability 0)."""
    observed = np.bincount(tokens, minlength=expected.shape[1]).astype(np.float64)
    mass = expected.sum(0)
    if observed[mass == 0].any():
        return 0.0
    big = mass >= MIN_EXPECTED
    cells_o = [*observed[big], observed[~big].sum()]
    cells_e = [*mass[big], mass[~big].sum()]
    stat = sum((o - e) ** 2 / e for o, e in zip(cells_o, cells_e, strict=True) if e > 0)
    num_cells = sum(e > 0 for e in cells_e)
    return float(chi2.sf(stat, num_cells - 1))


@dataclass
class Samples:
    """Emitted tokens and their exact distributions, by label (block position, bonus kind)."""

    tokens: dict[str, list[npt.NDArray[np.int64]]] = field(default_factory=dict)
    expected: dict[str, list[Floats]] = field(default_factory=dict)
    num_rejected: int = 0  # steps that ended on a rejection (resampled from the residual)

    def add(self, label: str, tokens: npt.ArrayLike, expected: Floats) -> None:
        """tokens [n], expected [n, V]."""
        self.tokens.setdefault(label, []).append(np.asarray(tokens, dtype=np.int64))
        self.expected.setdefault(label, []).append(expected)

    def count(self, label: str) -> int:
        return sum(len(chunk) for chunk in self.tokens.get(label, []))

    def exact(self, label: str) -> Floats:
        return np.concatenate(self.expected[label])

    def pvalues(self) -> dict[str, float]:
        return {
            label: pearson_pvalue(np.concatenate(chunks), self.exact(label))
            for label, chunks in self.tokens.items()
        }


# -- deliberately wrong rules (the power check) ------------------------------------------------


def wrong_rule(bug: str) -> Verify:
    """``verify_rejection`` with one deliberate bug; same signature. Bugs: ``swapped_ratio``
    (accept with min(1, q/p)), ``resample_from_target`` (after a rejection draw from p, not
    normalise(max(p - q, 0))), ``bonus_off_by_one`` (after a fully accepted block draw from
    the last draft position's p instead of the next one's)."""

    def verify(drafts, num_draft, draft_probs, target_probs, accept_u, bonus_u):  # type: ignore[no-untyped-def]
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

    def probs(logits: torch.Tensor, given: Params) -> torch.Tensor:  # [n, W, V] per-row params
        n = logits.shape[0]
        return sampling_probs(
            logits,
            torch.full((n,), given.temperature),
            torch.full((n,), given.top_p),
            torch.full((n,), given.top_k, dtype=torch.long),
        )

    n = NUM_ROWS
    is_ragged = torch.arange(n) % 2 == 1
    num_draft = torch.where(
        is_ragged, torch.randint(0, NUM_SPEC + 1, (n,), generator=gen), NUM_SPEC
    )
    tokens = [torch.randint(0, VOCAB, (n,), generator=gen)]
    draft_probs = []
    for _ in range(NUM_SPEC):  # x_j ~ q(. | x_{j-1})
        q = probs(draft_logits[tokens[-1]][:, None], params)[:, 0]
        draft_probs.append(q)
        tokens.append(sample_from_probs(q, torch.rand(n, generator=gen)))
    context = torch.stack(tokens, 1)  # [n, K + 1]: last token, then the drafts
    accepted, bonus = verify(
        context[:, 1:],
        num_draft,
        torch.stack(draft_probs, 1),
        probs(target_logits[context], target_probs_params or params),
        torch.rand(n, NUM_SPEC, generator=gen),
        torch.rand(n, generator=gen),
    )
    num_accepted = accepted.sum(1)
    exact = truncated(target_logits.double().numpy(), params)  # [V, V]
    samples = Samples()
    for j in range(1, NUM_SPEC + 2):  # block position j; its context is token j - 1
        reached = (num_accepted >= j - 1) & (num_draft >= j - 1)
        emitted = torch.where(num_accepted >= j, context[:, min(j, NUM_SPEC)], bonus)[reached]
        samples.add(f"position {j}", emitted, exact[context[reached, j - 1]])
    # After a fully accepted block (k drafts, any k) the bonus is p's at position k + 1. (A
    # resample after a rejection is not p-distributed given the rejection, only within its
    # position's pool above.)
    is_full = num_accepted == num_draft
    last = context[torch.arange(n), num_accepted]
    samples.add("bonus after full block", bonus[is_full], exact[last[is_full]])
    is_full_7 = is_full & (num_draft == NUM_SPEC)
    samples.add("bonus after full k=7 block", bonus[is_full_7], exact[last[is_full_7]])
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


# Measured minimum p-values over the labels (seeded, so every run gives these):
#   swapped_ratio: 0.0 (chi2.sf underflows; the statistic is ~1e4) with temperature 1
#   resample_from_target: 0.0 (statistic ~4e3); bonus_off_by_one: ~1e-300 at "bonus after
#   full k=7 block"; untruncated target with top-k 3: 0.0 (emits tokens outside the top-k).
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


def test_reference_truncation_matches_sampling_probs_on_ties_free_logits() -> None:
    logits = torch.randn(200, 1, 50, generator=torch.Generator().manual_seed(2)) * 2
    for params in CHAIN_PARAMS.values():
        n = logits.shape[0]
        engine = sampling_probs(
            logits,
            torch.full((n,), params.temperature),
            torch.full((n,), params.top_p),
            torch.full((n,), params.top_k, dtype=torch.long),
        )
        np.testing.assert_allclose(
            engine.double().numpy(), truncated(logits.numpy(), params), atol=1e-6
        )


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


def engine_samples(pair: tuple[Path, Path]) -> tuple[Samples, npt.NDArray[np.int64]]:
    """Every emitted token labelled by its block position in its step, with the target's exact
    conditional (teacher forcing of the request's own tokens); and, per emitted token, how many
    tokens top-p alone would keep (top-k binds above ENGINE_PARAMS.top_k, top-p below)."""
    prompts, requests = run_seeded_requests(pair)
    model = transformers.AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32)
    samples, nucleus_sizes = Samples(), []
    top_p_only = dataclasses.replace(ENGINE_PARAMS, top_k=0)
    with torch.no_grad():
        for prompt, request in zip(prompts, requests, strict=True):
            out = request.output_ids
            logits = model.eval()(torch.tensor([prompt + out[:-1]])).logits[0, len(prompt) - 1 :]
            exact = truncated(logits.double().numpy(), ENGINE_PARAMS)  # [len(out), V]
            nucleus_sizes.append((truncated(logits.double().numpy(), top_p_only) > 0).sum(-1))
            samples.add("prefill", out[:1], exact[:1])
            t = 1  # out[0] came from the prefill
            for k, length in zip(request.spec_tokens, request.accept_lengths, strict=True):
                for j in range(1, length + 1):  # block position j of this step
                    samples.add(f"position {j}", out[t : t + 1], exact[t : t + 1])
                    if j == k + 1:
                        samples.add("bonus after full block", out[t : t + 1], exact[t : t + 1])
                    t += 1
    return samples, np.concatenate(nucleus_sizes)


def test_engine_sampling_follows_the_target_at_every_block_position(agreeing_pair) -> None:
    samples, nucleus_sizes = engine_samples(agreeing_pair)
    pvalues = samples.pvalues()
    assert min(pvalues.values()) > ALPHA, pvalues
    assert samples.count("position 8") > 200, samples.count("position 8")  # 7 drafts accepted
    top_k = ENGINE_PARAMS.top_k
    assert (nucleus_sizes > top_k).mean() > 0.05, "top-k must bind"
    assert (nucleus_sizes < top_k).mean() > 0.5, "top-p must bind"


# Measured with the swapped rule: p-value 2e-192 at position 1, 0.0 at positions 3-6.
def test_engine_with_a_wrong_rule_fails_the_same_statistics(agreeing_pair, monkeypatch) -> None:
    monkeypatch.setattr(runner_module, "verify_rejection", wrong_rule("swapped_ratio"))
    pvalues = engine_samples(agreeing_pair)[0].pvalues()
    assert min(pvalues.values()) < ALPHA, pvalues
