"""Published model shapes, for benchmarks and cost tables with random weights."""

from __future__ import annotations

from dataclasses import replace

from engines.embedded.checkpoint import DraftSpec, ModelShape

QWEN3_VOCAB = 151936
QWEN3_MASK_TOKEN_ID = 151669


def _qwen3(hidden: int, intermediate: int, layers: int, heads: int, tied: bool) -> ModelShape:
    return ModelShape(
        vocab_size=QWEN3_VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        has_qk_norm=True,
        attention_bias=False,
        tie_word_embeddings=tied,
    )


TARGET_SHAPES: dict[str, ModelShape] = {
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, tied=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, tied=True),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, tied=True),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, tied=False),
    "qwen3-32b": _qwen3(5120, 25600, 64, 64, tied=False),
}


# A tiny random shape for CPU smoke runs of the GPU benchmarks (their timings mean nothing).
TINY_SHAPE = ModelShape(
    vocab_size=4096,
    hidden_size=128,
    intermediate_size=256,
    num_layers=8,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    has_qk_norm=True,
    attention_bias=False,
    tie_word_embeddings=False,
)


def draft_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """``dflash.model.build_target_layer_ids``: spread over layers 1 .. n - 3."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


def dflash_draft_for(target: ModelShape, block_size: int = 16, num_layers: int = 5) -> DraftSpec:
    """A z-lab style DFlash draft for ``target`` (5 Qwen3 layers of the target's width)."""
    shape = replace(target, num_layers=num_layers)
    return DraftSpec(
        shape=shape,
        block_size=block_size,
        target_layer_ids=draft_layer_ids(target.num_layers, num_layers),
        mask_token_id=min(QWEN3_MASK_TOKEN_ID, target.vocab_size - 1),
        input_embedding_scale=1.0,
        output_multiplier=1.0,
        final_logit_softcapping=None,
    )


def shape_by_name(name: str) -> ModelShape:
    try:
        return TARGET_SHAPES[name]
    except KeyError:
        raise ValueError(f"shape {name!r}: known shapes are {sorted(TARGET_SHAPES)}") from None
