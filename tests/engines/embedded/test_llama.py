"""Llama targets (no q/k norm) load and match transformers' LlamaForCausalLM."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engines.embedded.loader import load_runner
from tests.engines.embedded.conftest import random_prompt
from tests.tinymodels import write_tiny_pair

transformers = pytest.importorskip("transformers")


@torch.no_grad()
def test_llama_target_logits_match_transformers(tmp_path) -> None:
    target_dir, draft_dir = write_tiny_pair(tmp_path)
    weights = load_file(str(target_dir / "model.safetensors"))
    save_file(
        {k: v for k, v in weights.items() if "q_norm" not in k and "k_norm" not in k},
        str(target_dir / "model.safetensors"),
    )
    config = json.loads((target_dir / "config.json").read_text())
    config.update(architectures=["LlamaForCausalLM"], model_type="llama", mlp_bias=False)
    (target_dir / "config.json").write_text(json.dumps(config))
    runner = load_runner(target_dir, draft_dir, torch.device("cpu"), 1, 64)
    reference = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    assert type(reference).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([random_prompt(9, 16)])
    hidden, _ = runner.target(ids, torch.arange(16)[None], runner.target_cache, num_keys=16)
    torch.testing.assert_close(
        runner.target.logits(hidden), reference.eval()(ids).logits, atol=1e-4, rtol=1e-4
    )
