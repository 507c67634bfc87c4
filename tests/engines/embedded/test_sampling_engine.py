"""Sampling through the whole engine (drafts + rejection) keeps the target distribution."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch
from scipy.stats import chisquare

from engines.embedded.events import SamplingParams
from engines.embedded.request import Request
from tests.engines.embedded.conftest import BLOCK_SIZE, fixed_k, make_engine, random_prompt

transformers = pytest.importorskip("transformers")

TEMPERATURE, TOP_K = 1.0, 6


def target_second_token_probs(target_dir, prompt: list[int], first: int) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model.eval()(torch.tensor([[*prompt, first]])).logits[0, -1] / TEMPERATURE
    top = torch.topk(logits, TOP_K)
    probs = torch.zeros_like(logits)
    probs[top.indices] = torch.softmax(top.values, -1)
    return probs


def test_speculative_sampling_matches_target_distribution(agreeing_pair) -> None:
    """2400 seeded requests of 3 tokens (so k = 1 after the clamp to what can still be
    emitted): the 2nd token comes out of the rejection
    sampler (accepted draft or residual resample). Grouped by the 1st token, its counts must
    fit the target's top-k/temperature distribution (chi-square)."""
    prompt = random_prompt(11, 10)
    engine = make_engine(agreeing_pair, max_batch_size=16)
    requests = []
    for seed in range(2400):
        params = SamplingParams(max_new_tokens=3, temperature=TEMPERATURE, top_k=TOP_K, seed=seed)
        requests.append(Request(str(seed), prompt, params, fixed_k(BLOCK_SIZE - 1), {}))
        engine.add(requests[-1])
    while engine.has_work:
        engine.step()
    by_first: dict[int, Counter[int]] = defaultdict(Counter)
    accepted_first_draft = 0
    for request in requests:
        by_first[request.output_ids[0]][request.output_ids[1]] += 1
        accepted_first_draft += request.accept_lengths[0] > 1
    assert 0.05 < accepted_first_draft / len(requests) < 0.95, "accept and reject both needed"
    tested = 0
    for first, counts in by_first.items():
        total = sum(counts.values())
        if total < 400:
            continue
        probs = target_second_token_probs(agreeing_pair[0], prompt, first)
        support = torch.nonzero(probs).flatten().tolist()
        assert set(counts) <= set(support), "emitted a token outside the target's top-k"
        observed = [counts[t] for t in support]
        mass = [float(probs[t]) for t in support]
        expected = [m / sum(mass) * total for m in mass]
        assert chisquare(observed, expected).pvalue > 1e-3, (first, observed, expected)
        tested += 1
    assert tested >= 1


def test_seeded_requests_reproduce_whatever_the_batch(agreeing_pair) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.9, seed=42)
    outputs = []
    for companions in (0, 5):
        engine = make_engine(agreeing_pair)
        request = Request("r", random_prompt(3), params, fixed_k(4), {})
        engine.add(request)
        for i in range(companions):
            engine.add(
                Request(
                    f"c{i}",
                    random_prompt(50 + i),
                    SamplingParams(max_new_tokens=20, temperature=1.0),
                    fixed_k(i),
                    {},
                )
            )
        while engine.has_work:
            engine.step()
        outputs.append(request.output_ids)
    assert outputs[0] == outputs[1]
