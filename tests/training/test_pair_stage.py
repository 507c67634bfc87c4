"""The GPU stage end to end on CPU with a toy recipe: exports load, and a rerun resumes."""

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dflash_model = pytest.importorskip("dflash.model")

from tokenizers import Tokenizer  # noqa: E402

from tests.training.test_export import tiny_tokenizer  # noqa: E402
from training.pair import train_pair  # noqa: E402
from training.recipe import load_recipe, scale_time  # noqa: E402

RECIPE = """
name: toy
target: {hidden_size: 32, num_layers: 6, intermediate_size: 64, num_heads: 4, num_kv_heads: 2,
         head_dim: 8, max_position_embeddings: 256}
target_train: {seq_len: 64, batch_size: 4, time_budget_s: 2.0, warmup_steps: 2, checkpoint_every: 5}
generation: {time_budget_s: 5.0, batch_size: 4, max_new_tokens: 8}
corpus: {num_generation_prompts: 4}
draft:
  num_layers: 2
  block_sizes: [8]
  num_anchors: 4
  train: {seq_len: 64, batch_size: 4, time_budget_s: 2.0, warmup_steps: 2, checkpoint_every: 5}
"""


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    tiny_tokenizer(tmp_path / "tokenizer")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    vocab = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json")).get_vocab_size()
    rng = np.random.default_rng(0)
    rng.integers(4, vocab, 5000, dtype=np.uint16).tofile(corpus / "train.bin")
    rng.integers(4, vocab, 500, dtype=np.uint16).tofile(corpus / "val.bin")
    rng.integers(4, vocab, 40, dtype=np.uint16).tofile(corpus / "prompts.bin")
    np.save(corpus / "prompts.idx.npy", np.arange(0, 41, 10, dtype=np.int64))
    (tmp_path / "toy.yaml").write_text(RECIPE)
    return tmp_path


@pytest.mark.slow
def test_pair_stage_exports_loadable_dirs_and_resumes(work: Path):
    recipe = load_recipe(work / "toy.yaml")
    first = train_pair(recipe, work, work / "out")
    draft = dflash_model.DFlashDraftModel.from_pretrained(work / "out" / "draft8")
    assert draft.block_size == 8 and (work / "out" / "target" / "tokenizer.json").exists()
    second = train_pair(scale_time(recipe, 2.0), work, work / "out")
    assert second["target"]["steps"] > first["target"]["steps"]
    assert second["drafts"]["block8"]["steps"] > first["drafts"]["block8"]["steps"]
    assert second["continuation_tokens"] == first["continuation_tokens"]  # reused, not redone
    assert (
        json.loads((work / "out" / "train.json").read_text())["target"]["steps"]
        == (second["target"]["steps"])
    )
