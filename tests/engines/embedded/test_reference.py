"""The engine's forwards against transformers' Qwen3 and the dflash reference package."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.embedded.kv_cache import KVCache
from engines.embedded.loader import load_runner
from engines.embedded.runner import ModelRunner
from tests.engines.embedded.conftest import (
    BLOCK_SIZE,
    fixed_k,
    greedy_request,
    make_engine,
    random_prompt,
    run_all,
)

dflash_model = pytest.importorskip("dflash.model")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def references(tiny_pair: tuple[Path, Path]) -> tuple[torch.nn.Module, torch.nn.Module]:
    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32)
    draft = dflash_model.DFlashDraftModel.from_pretrained(tiny_pair[1], dtype=torch.float32)
    return target.eval(), draft.eval()


@pytest.fixture(scope="module")
def runner(tiny_pair: tuple[Path, Path]) -> ModelRunner:
    return load_runner(tiny_pair[0], tiny_pair[1], torch.device("cpu"), 2, 128)


@torch.no_grad()
def test_target_logits_and_features_match_transformers(runner, references) -> None:
    hf_target, hf_draft = references
    ids = torch.tensor([random_prompt(3, 24)])
    expected = hf_target(ids, output_hidden_states=True)
    cache = runner.target_cache
    # Prefill 16 tokens, then 3 + 5 more through the cache: exercises cached attention.
    pieces = [(0, 16), (16, 19), (19, 24)]
    for first, end in pieces:
        positions = torch.arange(first, end)[None]
        hidden, features = runner.target(ids[:, first:end], positions, cache, num_keys=end)
        torch.testing.assert_close(
            runner.target.logits(hidden), expected.logits[:, first:end], atol=1e-4, rtol=1e-4
        )
        # dflash.model.extract_context_feature: hidden_states[layer_id + 1].
        ref_features = torch.cat(
            [expected.hidden_states[i + 1][:, first:end] for i in hf_draft.target_layer_ids], -1
        )
        torch.testing.assert_close(features, ref_features, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_draft_logits_match_dflash_reference(runner, references) -> None:
    hf_target, hf_draft = references
    ids = torch.tensor([random_prompt(4, 20)])
    features = torch.cat(
        [
            hf_target(ids, output_hidden_states=True).hidden_states[i + 1]
            for i in hf_draft.target_layer_ids
        ],
        -1,
    )
    cache: KVCache = runner.draft_cache
    for context_len in (12, 20):  # second round adds context incrementally
        new = slice(context_len - 8 if context_len == 20 else 0, context_len)
        runner.draft.insert_context(features[:, new], torch.arange(20)[None, new], cache)
        block = torch.full((1, BLOCK_SIZE), hf_draft.mask_token_id)
        block[0, 0] = ids[0, context_len - 1]
        positions = torch.arange(context_len, context_len + BLOCK_SIZE)[None]
        logits = runner.draft.propose(block, positions, cache, runner.target)
        ref_hidden = hf_draft(
            target_hidden=features[:, :context_len],
            noise_embedding=hf_target.get_input_embeddings()(block),
            position_ids=torch.arange(context_len + BLOCK_SIZE)[None],
        )
        ref_logits = hf_draft.compute_logits(ref_hidden[:, 1:], hf_target.lm_head)
        torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pair_name", ["tiny_pair", "agreeing_pair"])
def test_greedy_output_equals_dflash_generate(pair_name: str, request) -> None:
    pair = request.getfixturevalue(pair_name)
    hf_target = transformers.AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32)
    hf_draft = dflash_model.DFlashDraftModel.from_pretrained(pair[1], dtype=torch.float32)
    engine = make_engine(pair, max_batch_size=4)
    prompts = [random_prompt(100 + i, 8 + i) for i in range(6)]
    requests = [
        greedy_request(str(i), p, 24, fixed_k(BLOCK_SIZE - 1)) for i, p in enumerate(prompts)
    ]
    run_all(engine, requests)
    for prompt, req in zip(prompts, requests, strict=True):
        expected = dflash_model.dflash_generate(
            hf_draft.eval(),
            hf_target.eval(),
            torch.tensor([prompt]),
            24,
            None,
            block_size=BLOCK_SIZE,
        )
        assert req.output_ids == expected[0, len(prompt) :].tolist()
    if pair_name == "agreeing_pair":  # multi-token accepts were exercised
        assert max(max(r.accept_lengths) for r in requests) >= 4
