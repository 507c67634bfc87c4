"""Stage 2: the tokenized training corpus, written as uint16 token ids (never committed).

Output (in the work folder, which travels to the GPU through `carry`):
- train.bin / val.bin: documents joined by <|endoftext|>, shuffled at document level;
- prompts.bin + prompts.idx.npy: chat prompts from the training sources, whose greedy target
  continuations train the draft (DFlash drafts learn the target's own outputs);
- corpus.json: token counts per source.
"""

import json
import logging
import random
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from training import sources
from training.chat import ENDOFTEXT, exchange, render
from training.recipe import Recipe

log = logging.getLogger(__name__)
MAX_PROMPT_TOKENS = 192


def documents(recipe: Recipe, data_dir: Path) -> dict[str, list[str]]:
    corpus = recipe.corpus
    math = list(sources.math_documents(data_dir)) * corpus.math_repeats
    mbpp = list(sources.mbpp_documents(data_dir)) * corpus.math_repeats
    code = list(sources.code_documents(corpus.code_packages, corpus.code_bytes, recipe.seed))
    chat = list(sources.chat_documents(corpus.chat_bytes))
    return {"math": math, "mbpp": mbpp, "code": code, "chat": chat}


def encode(tokenizer: Tokenizer, texts: list[str], desc: str) -> list[list[int]]:
    out: list[list[int]] = []
    for start in tqdm(range(0, len(texts), 1024), desc=f"encode {desc}", unit="kdoc"):
        out.extend(e.ids for e in tokenizer.encode_batch(texts[start : start + 1024]))
    return out


def write_stream(path: Path, docs: list[list[int]], eot: int) -> int:
    stream = np.fromiter(
        (t for doc in docs for t in (*doc, eot)),
        dtype=np.uint16,
        count=sum(len(d) + 1 for d in docs),
    )
    stream.tofile(path)
    return int(stream.size)


def training_prompts(recipe: Recipe, data_dir: Path) -> list[str]:
    rng = random.Random(recipe.seed)
    prompts = [
        render(exchange(r["question"], "")[:1], True) for r in sources.gsm8k(data_dir, "train")
    ]
    prompts += [render(exchange(p["_text"], "")[:1], True) for p in sources.champ()]
    prompts += [
        render(exchange(sources.mbpp_prompt(r), "")[:1], True)
        for r in sources.mbpp(data_dir, test=False)
    ]
    prompts += [render(m[:1], True) for m in sources.sharegpt(0, sources.SHAREGPT_EVAL_START)]
    rng.shuffle(prompts)
    return prompts


def write_prompts(out_dir: Path, prompts: list[list[int]]) -> None:
    kept = [p for p in prompts if len(p) <= MAX_PROMPT_TOKENS]
    offsets = np.cumsum([0] + [len(p) for p in kept]).astype(np.int64)
    np.fromiter((t for p in kept for t in p), dtype=np.uint16, count=int(offsets[-1])).tofile(
        out_dir / "prompts.bin"
    )
    np.save(out_dir / "prompts.idx.npy", offsets)


def build_corpus(recipe: Recipe, data_dir: Path, tokenizer_dir: Path, out_dir: Path) -> dict:
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eot = tokenizer.token_to_id(ENDOFTEXT)
    assert eot is not None, (
        f"{tokenizer_dir}: tokenizer has no {ENDOFTEXT}: rerun the tokenizer stage"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    encoded: list[list[int]] = []
    counts = {}
    for name, texts in documents(recipe, data_dir).items():
        ids = encode(tokenizer, texts, name)
        counts[name] = {"documents": len(ids), "tokens": sum(len(d) + 1 for d in ids)}
        encoded.extend(ids)
    random.Random(recipe.seed).shuffle(encoded)
    num_val = max(1, int(len(encoded) * recipe.corpus.validation_fraction))
    stats = {
        "sources": counts,
        "val_tokens": write_stream(out_dir / "val.bin", encoded[:num_val], eot),
        "train_tokens": write_stream(out_dir / "train.bin", encoded[num_val:], eot),
    }
    prompts = training_prompts(recipe, data_dir)[: recipe.corpus.num_generation_prompts * 2]
    write_prompts(out_dir, encode(tokenizer, prompts, "prompts"))
    (out_dir / "corpus.json").write_text(json.dumps(stats, indent=2) + "\n")
    log.info("corpus: %s", stats)
    return stats
