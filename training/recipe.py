"""The recipe's configuration: one YAML file per pair (configs/demo.yaml, configs/testbed.yaml).

Frozen dataclasses, loaded by one function; unknown keys are errors naming the dotted key, so a
typo never silently trains a different model. Plain dataclasses (no pydantic) because the same
code runs on the GPU machine, whose image has PyYAML but not pydantic.
"""

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass(frozen=True)
class TokenizerConfig:
    vocab_size: int = 6144  # including the 4 special tokens
    sample_bytes: int = 40_000_000  # text the BPE merges are learned from


@dataclass(frozen=True)
class CorpusConfig:
    chat_bytes: int = 24_000_000
    code_bytes: int = 18_000_000
    code_packages: list[str] = field(default_factory=lambda: ["transformers", "torch"])
    math_repeats: int = 3  # GSM8K/CHAMP/MBPP are small: repeat them in the token stream
    validation_fraction: float = 0.01
    num_generation_prompts: int = 4096  # prompts whose target continuations train the draft


@dataclass(frozen=True)
class TargetConfig:
    hidden_size: int = 256
    num_layers: int = 8
    intermediate_size: int = 768
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 10_000.0
    max_position_embeddings: int = 4096


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int = 512
    batch_size: int = 128
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 200
    weight_decay: float = 0.1
    time_budget_s: float = 200.0
    max_steps: int = 100_000
    checkpoint_every: int = 500
    compile: bool = False


@dataclass(frozen=True)
class GenerationConfig:
    time_budget_s: float = 40.0
    batch_size: int = 512
    max_new_tokens: int = 256


@dataclass(frozen=True)
class DraftConfig:
    num_layers: int = 3
    block_sizes: list[int] = field(default_factory=lambda: [16, 8])
    target_layer_ids: list[int] | None = None  # None: dflash's build_target_layer_ids
    num_anchors: int = 32  # blocks trained per sequence
    loss_decay_gamma: float | None = None  # None: 7 for block 16, 5 for block 8 (DFlash paper)
    generated_fraction: float = 0.5  # share of rows taken from target continuations
    train: TrainConfig = field(default_factory=lambda: TrainConfig(time_budget_s=90.0))


@dataclass(frozen=True)
class Recipe:
    name: str = "demo"
    seed: int = 1234
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    target_train: TrainConfig = field(default_factory=TrainConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)


class RecipeError(ValueError):
    """A recipe file that does not match the schema; the message names the dotted key."""


def load_recipe(path: Path) -> Recipe:
    raw = yaml.safe_load(path.read_text()) or {}
    return _build(Recipe, raw, prefix="", source=path)


def scale_time(recipe: Recipe, factor: float) -> Recipe:
    """The same recipe with every wall-clock budget multiplied by factor."""
    if factor == 1.0:
        return recipe
    scaled = dataclasses.replace
    draft_train = scaled(
        recipe.draft.train, time_budget_s=recipe.draft.train.time_budget_s * factor
    )
    return scaled(
        recipe,
        target_train=scaled(
            recipe.target_train, time_budget_s=recipe.target_train.time_budget_s * factor
        ),
        generation=scaled(
            recipe.generation, time_budget_s=recipe.generation.time_budget_s * factor
        ),
        draft=scaled(recipe.draft, train=draft_train),
    )


def as_dict(recipe: Recipe) -> dict:
    return dataclasses.asdict(recipe)


def _build(cls: type, raw: object, prefix: str, source: Path):
    if not isinstance(raw, dict):
        raise RecipeError(f"{source}: {prefix or 'top level'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RecipeError(
            f"{source}: {prefix}{unknown[0]}: unknown key (known: {', '.join(sorted(known))})"
        )
    values = {}
    for name, value in raw.items():
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            values[name] = _build(hint, value, f"{prefix}{name}.", source)
        else:
            _check_type(hint, value, f"{prefix}{name}", source)
            values[name] = value
    return cls(**values)


def _check_type(hint: object, value: object, key: str, source: Path) -> None:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    expected = typing.cast(type, origin or hint)
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        name = getattr(expected, "__name__", str(expected))
        raise RecipeError(f"{source}: {key}: expected {name}, got {value!r}")
