"""Write the pair in the standard on-disk formats, 16-bit safetensors.

- target/: a Hugging Face Qwen3 directory (config.json, model.safetensors, generation_config.json,
  tokenizer.json, tokenizer_config.json with the chat template);
- draft/: a DFlash directory (config.json with `dflash_config` {block_size, target_layer_ids,
  mask_token_id} and `num_target_layers`; model.safetensors without embeddings or LM head,
  which the engine takes from the target, as in published DFlash checkpoints).
"""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from training.chat import ENDOFTEXT, IM_END, SPECIAL_TOKENS

DTYPE = torch.bfloat16


def export_target(model, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to("cpu", DTYPE).contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }  # tied to model.embed_tokens.weight
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["dtype"] = "bfloat16"
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def export_draft(model, config: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to("cpu", DTYPE).contiguous()
        for k, v in model.state_dict().items()
        if "rotary_emb" not in k
    }
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = dict(config, dtype="bfloat16")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def finish_target_dir(target_dir: Path, tokenizer_dir: Path) -> None:
    """Add the tokenizer and generation config (done where the tokenizer lives)."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, target_dir / name)
    generation = {
        "eos_token_id": [SPECIAL_TOKENS.index(IM_END), SPECIAL_TOKENS.index(ENDOFTEXT)],
        "pad_token_id": SPECIAL_TOKENS.index(ENDOFTEXT),
        "do_sample": False,
    }
    (target_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
