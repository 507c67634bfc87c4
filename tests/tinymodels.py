"""Tiny random Qwen3 target + DFlash draft checkpoints, written in the published on-disk formats.

``write_tiny_pair(root)`` writes two Hugging Face style directories that real loaders accept:

* ``<root>/tiny-qwen3-target``: ``config.json`` (``Qwen3ForCausalLM``), ``model.safetensors``,
  ``generation_config.json`` and a byte-level BPE tokenizer (``tokenizer.json`` +
  ``tokenizer_config.json`` with a Qwen-style chat template). Every string encodes (one token
  per byte) and four special tokens follow the 256 byte tokens.
* ``<root>/tiny-dflash-draft``: ``config.json`` (``DFlashDraftModel``, ``model_type: qwen3``,
  ``dflash_config: {block_size, target_layer_ids, mask_token_id}``, ``num_target_layers``) and
  ``model.safetensors`` with the draft's own layers, ``fc`` and ``hidden_norm`` only: it shares
  the target's embeddings and LM head, as the published z-lab checkpoints do. vLLM's ``dflash``
  method and ``dflash.model.DFlashDraftModel.from_pretrained`` both load it.

Only torch, safetensors and tokenizers are needed, so the vLLM virtualenv can import this file
too. Same arguments and seed give byte-identical weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

TARGET_DIRNAME = "tiny-qwen3-target"
DRAFT_DIRNAME = "tiny-dflash-draft"

# Token ids 0..255 are the 256 bytes (GPT-2 byte-to-unicode alphabet); specials follow.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>")
ENDOFTEXT_ID, IM_START_ID, IM_END_ID, MASK_ID = 256, 257, 258, 259

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Same spacing rule as ``dflash.model.build_target_layer_ids``."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def write_tiny_pair(
    root: Path,
    *,
    block_size: int = 8,
    seed: int = 0,
    vocab_size: int = 320,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_target_layers: int = 6,
    num_draft_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    head_dim: int = 32,  # vLLM CPU attention supports 32, 64, 80, ...; not 16
    max_position_embeddings: int = 2048,
    target_layer_ids: list[int] | None = None,
    bias_token_id: int | None = None,
    bias_strength: float = 0.0,
) -> tuple[Path, Path]:
    """Write a tiny target and DFlash draft under ``root``; return ``(target_dir, draft_dir)``.

    ``bias_token_id``/``bias_strength`` make the pair agree more often: a shared direction is
    added to every embedding row and token ``bias_token_id``'s LM-head row is aligned with it,
    so target and draft both tend to predict that token (strength 0: plain random weights,
    which accept almost no drafts). Use it to exercise multi-token acceptance.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size={vocab_size}: must be >= 260 (256 bytes + 4 specials)")
    if num_attention_heads % num_key_value_heads:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    layer_ids = target_layer_ids or default_target_layer_ids(num_target_layers, num_draft_layers)
    if max(layer_ids) >= num_target_layers:
        raise ValueError(f"target_layer_ids={layer_ids}: must be < {num_target_layers}")
    root = Path(root)
    target_dir, draft_dir = root / TARGET_DIRNAME, root / DRAFT_DIRNAME
    target_dir.mkdir(parents=True, exist_ok=True)
    draft_dir.mkdir(parents=True, exist_ok=True)

    shape = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_position_embeddings,
    }
    gen = torch.Generator().manual_seed(seed)
    embed, lm_head = _embedding_and_head(gen, vocab_size, hidden_size, bias_token_id, bias_strength)
    target = {"model.embed_tokens.weight": embed, "lm_head.weight": lm_head}
    for i in range(num_target_layers):
        target.update(_layer_weights(gen, f"model.layers.{i}.", shape))
    target["model.norm.weight"] = _norm(gen, hidden_size)
    draft: dict[str, torch.Tensor] = {}
    for i in range(num_draft_layers):
        draft.update(_layer_weights(gen, f"layers.{i}.", shape))
    draft["fc.weight"] = _linear(gen, hidden_size, hidden_size * len(layer_ids))
    draft["hidden_norm.weight"] = _norm(gen, hidden_size)
    draft["norm.weight"] = _norm(gen, hidden_size)

    save_file(target, str(target_dir / "model.safetensors"), metadata={"format": "pt"})
    save_file(draft, str(draft_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_json(target_dir / "config.json", _target_config(shape, num_target_layers))
    _write_json(
        draft_dir / "config.json",
        _draft_config(shape, num_draft_layers, num_target_layers, block_size, layer_ids),
    )
    _write_json(
        target_dir / "generation_config.json",
        {"eos_token_id": [IM_END_ID, ENDOFTEXT_ID], "pad_token_id": ENDOFTEXT_ID},
    )
    write_tokenizer(target_dir)
    return target_dir, draft_dir


def _embedding_and_head(
    gen: torch.Generator,
    vocab_size: int,
    hidden_size: int,
    bias_token_id: int | None,
    bias_strength: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Embeddings with unit variance and an LM head giving logits of std ~2 keep argmax gaps
    # far above float noise, so greedy comparisons across implementations are stable.
    embed = torch.randn(vocab_size, hidden_size, generator=gen)
    lm_head = torch.randn(vocab_size, hidden_size, generator=gen) * (2.0 / math.sqrt(hidden_size))
    if bias_token_id is not None and bias_strength > 0:
        direction = torch.randn(hidden_size, generator=gen)
        direction = direction / direction.norm()
        embed += bias_strength * math.sqrt(hidden_size) * direction
        lm_head[bias_token_id] = bias_strength * 4.0 * direction
    return embed, lm_head


def _linear(gen: torch.Generator, out_features: int, in_features: int) -> torch.Tensor:
    # std 1/sqrt(fan_in): every layer changes the residual stream by O(1), so position and
    # cache bugs change outputs.
    return torch.randn(out_features, in_features, generator=gen) / math.sqrt(in_features)


def _norm(gen: torch.Generator, size: int) -> torch.Tensor:
    return 1.0 + 0.1 * torch.randn(size, generator=gen)


def _layer_weights(
    gen: torch.Generator, prefix: str, shape: dict[str, int]
) -> dict[str, torch.Tensor]:
    hidden, inter, hd = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
    q_out = shape["num_attention_heads"] * hd
    kv_out = shape["num_key_value_heads"] * hd
    return {
        f"{prefix}self_attn.q_proj.weight": _linear(gen, q_out, hidden),
        f"{prefix}self_attn.k_proj.weight": _linear(gen, kv_out, hidden),
        f"{prefix}self_attn.v_proj.weight": _linear(gen, kv_out, hidden),
        f"{prefix}self_attn.o_proj.weight": _linear(gen, hidden, q_out),
        f"{prefix}self_attn.q_norm.weight": _norm(gen, hd),
        f"{prefix}self_attn.k_norm.weight": _norm(gen, hd),
        f"{prefix}mlp.gate_proj.weight": _linear(gen, inter, hidden),
        f"{prefix}mlp.up_proj.weight": _linear(gen, inter, hidden),
        f"{prefix}mlp.down_proj.weight": _linear(gen, hidden, inter),
        f"{prefix}input_layernorm.weight": _norm(gen, hidden),
        f"{prefix}post_attention_layernorm.weight": _norm(gen, hidden),
    }


def _common_config(shape: dict[str, int], num_layers: int) -> dict[str, object]:
    return {
        "model_type": "qwen3",
        **shape,
        "num_hidden_layers": num_layers,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": num_layers,
        "layer_types": ["full_attention"] * num_layers,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "torch_dtype": "float32",
    }


def _target_config(shape: dict[str, int], num_layers: int) -> dict[str, object]:
    return {"architectures": ["Qwen3ForCausalLM"], **_common_config(shape, num_layers)}


def _draft_config(
    shape: dict[str, int],
    num_layers: int,
    num_target_layers: int,
    block_size: int,
    layer_ids: list[int],
) -> dict[str, object]:
    return {
        "architectures": ["DFlashDraftModel"],
        **_common_config(shape, num_layers),
        "num_target_layers": num_target_layers,
        "block_size": block_size,
        "dflash_config": {
            "block_size": block_size,
            "target_layer_ids": list(layer_ids),
            "mask_token_id": MASK_ID,
        },
    }


def _byte_alphabet() -> list[str]:
    """GPT-2's reversible byte -> printable unicode map, in byte order."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tokenizer(directory: Path) -> None:
    """Write a byte-level BPE tokenizer (no merges) with Qwen-style specials and chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    assert tokenizer.token_to_id("<|MASK|>") == MASK_ID, "special token ids moved"
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "additional_special_tokens": ["<|im_start|>", "<|MASK|>"],
            "model_max_length": 2048,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def _write_json(path: Path, data: dict[str, object]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
