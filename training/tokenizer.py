"""Stage 1: a byte-level BPE tokenizer with a Qwen-style chat template, saved as a HF tokenizer.

Pre-tokenization follows Qwen2's split (digits one at a time, so numbers stay regular for the
draft), then byte-level BPE. Special tokens take ids 0-3 (see training/chat.py).
"""

import itertools
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from training import sources
from training.chat import CHAT_TEMPLATE, ENDOFTEXT, IM_END, MASK, SPECIAL_TOKENS
from training.recipe import Recipe

log = logging.getLogger(__name__)

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def sample_text(recipe: Recipe, data_dir: Path) -> Iterator[str]:
    """About sample_bytes of text, a quarter each from math, code, chat and MBPP-style code."""
    quota = recipe.tokenizer.sample_bytes // 4
    streams = [
        itertools.chain(sources.math_documents(data_dir), sources.mbpp_documents(data_dir)),
        sources.code_documents(recipe.corpus.code_packages, quota, recipe.seed),
        sources.chat_documents(quota),
    ]
    for stream in streams:
        total = 0
        for text in stream:
            yield text
            total += len(text)
            if total >= quota:
                break


def train_tokenizer(recipe: Recipe, data_dir: Path, out_dir: Path) -> Tokenizer:
    tokenizer = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.tokenizer.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    texts = list(sample_text(recipe, data_dir))
    random.Random(recipe.seed).shuffle(texts)
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    save_hf_tokenizer(tokenizer, out_dir)
    log.info("tokenizer: %d tokens -> %s", tokenizer.get_vocab_size(), out_dir)
    return tokenizer


def save_hf_tokenizer(tokenizer: Tokenizer, out_dir: Path) -> None:
    """tokenizer.json + tokenizer_config.json, loadable by transformers' AutoTokenizer and vLLM."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "additional_special_tokens": [MASK],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
