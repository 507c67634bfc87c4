"""Read Hugging Face target and DFlash draft directories: config.json -> frozen shapes, weights.

Supported targets: ``Qwen3ForCausalLM`` and ``LlamaForCausalLM`` (default RoPE only, no sliding
window). Supported drafts: ``DFlashDraftModel`` (Qwen3-style layers, full non-causal attention,
``dflash_config`` with ``block_size``, ``target_layer_ids``, ``mask_token_id``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

TARGET_ARCHITECTURES = {"Qwen3ForCausalLM": True, "LlamaForCausalLM": False}  # -> has q/k norm
DRAFT_ARCHITECTURES = ("DFlashDraftModel",)


class CheckpointError(ValueError):
    """A checkpoint directory is missing, malformed or of an unsupported kind."""


@dataclass(frozen=True)
class ModelShape:
    """The transformer shape both target and draft share."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    has_qk_norm: bool
    attention_bias: bool
    tie_word_embeddings: bool


@dataclass(frozen=True)
class DraftSpec:
    shape: ModelShape
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    input_embedding_scale: float
    output_multiplier: float
    final_logit_softcapping: float | None


def read_config(directory: Path) -> dict[str, Any]:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: not found; pass a Hugging Face model directory")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _rope_theta(cfg: dict[str, Any], where: str) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    if rope_type not in (None, "default"):
        raise CheckpointError(f"{where}: rope type {rope_type!r} is not supported (default only)")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _shape(cfg: dict[str, Any], where: str, has_qk_norm: bool) -> ModelShape:
    if cfg.get("use_sliding_window"):
        raise CheckpointError(f"{where}: use_sliding_window=true is not supported")
    try:
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return ModelShape(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(cfg, where),
            has_qk_norm=has_qk_norm,
            attention_bias=bool(cfg.get("attention_bias", False)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )
    except KeyError as exc:
        raise CheckpointError(f"{where}: missing key {exc.args[0]!r}") from exc


def target_shape(directory: Path) -> ModelShape:
    cfg = read_config(directory)
    where = f"{directory}/config.json"
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in TARGET_ARCHITECTURES), None)
    if arch is None:
        raise CheckpointError(
            f"{where}: architectures={archs}; supported targets: {sorted(TARGET_ARCHITECTURES)}"
        )
    return _shape(cfg, where, TARGET_ARCHITECTURES[arch])


def _draft_value(cfg: dict[str, Any], name: str, default: Any = None) -> Any:
    """``dflash_config`` wins over the top level, as in ``dflash.model._draft_value``."""
    return (cfg.get("dflash_config") or {}).get(name, cfg.get(name, default))


def draft_spec(directory: Path, target: ModelShape) -> DraftSpec:
    cfg = read_config(directory)
    where = f"{directory}/config.json"
    archs = cfg.get("architectures") or []
    if not any(a in DRAFT_ARCHITECTURES for a in archs):
        raise CheckpointError(
            f"{where}: architectures={archs}; supported drafts: {list(DRAFT_ARCHITECTURES)}"
            " (DFlash2DraftModel is not supported)"
        )
    if cfg.get("is_causal") or (cfg.get("dflash_config") or {}).get("causal"):
        raise CheckpointError(f"{where}: causal DFlash drafts are not supported")
    shape = _shape(cfg, where, has_qk_norm=True)
    layer_ids = _draft_value(cfg, "target_layer_ids")
    mask_token_id = _draft_value(cfg, "mask_token_id")
    if not layer_ids or mask_token_id is None:
        raise CheckpointError(f"{where}: dflash_config needs target_layer_ids and mask_token_id")
    if max(layer_ids) >= target.num_layers or min(layer_ids) < 0:
        raise CheckpointError(
            f"{where}: dflash_config.target_layer_ids={layer_ids} outside the target's "
            f"{target.num_layers} layers: draft and target do not belong together"
        )
    if shape.hidden_size != target.hidden_size or shape.vocab_size != target.vocab_size:
        raise CheckpointError(
            f"{where}: hidden_size/vocab_size {shape.hidden_size}/{shape.vocab_size} differ from"
            f" the target's {target.hidden_size}/{target.vocab_size}"
        )
    softcap = _draft_value(cfg, "final_logit_softcapping")
    return DraftSpec(
        shape=shape,
        block_size=int(_draft_value(cfg, "block_size", 16)),
        target_layer_ids=tuple(int(i) for i in layer_ids),
        mask_token_id=int(mask_token_id),
        input_embedding_scale=float(_draft_value(cfg, "input_embedding_scale", 1.0)),
        output_multiplier=float(_draft_value(cfg, "output_multiplier", 1.0)),
        final_logit_softcapping=float(softcap) if softcap else None,
    )


def load_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of ``*.safetensors`` in ``directory`` (CPU, stored dtype)."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights
