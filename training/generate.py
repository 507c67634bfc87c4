"""Stage 3b: the target's own greedy continuations of training prompts (draft training rows).

DFlash drafts are trained on target-generated responses: at inference the block after the
anchor is the target's greedy chain, which a corpus row only approximates.
"""

import logging
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import Qwen3ForCausalLM

from training.chat import ENDOFTEXT, IM_END, SPECIAL_TOKENS
from training.recipe import Recipe

log = logging.getLogger(__name__)
EOT_ID = SPECIAL_TOKENS.index(ENDOFTEXT)
IM_END_ID = SPECIAL_TOKENS.index(IM_END)


def load_prompts(corpus_dir: Path) -> list[np.ndarray]:
    tokens = np.fromfile(corpus_dir / "prompts.bin", dtype=np.uint16)
    offsets = np.load(corpus_dir / "prompts.idx.npy")
    return [tokens[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


@torch.no_grad()
def continuations(recipe: Recipe, target: Qwen3ForCausalLM, corpus_dir: Path, device) -> np.ndarray:
    """uint16 stream of prompt + greedy continuation documents, joined by <|endoftext|>."""
    cfg = recipe.generation
    prompts = load_prompts(corpus_dir)[: recipe.corpus.num_generation_prompts]
    target.eval()
    docs: list[np.ndarray] = []
    started = time.perf_counter()
    for start in tqdm(range(0, len(prompts), cfg.batch_size), desc="continuations"):
        if time.perf_counter() - started > cfg.time_budget_s:
            break
        docs.extend(
            _generate_batch(
                target, prompts[start : start + cfg.batch_size], cfg.max_new_tokens, device
            )
        )
    stream = (
        np.concatenate([np.append(d, EOT_ID) for d in docs]).astype(np.uint16)
        if docs
        else np.zeros(0, np.uint16)
    )
    log.info(
        "continuations: %d documents, %d tokens in %.1fs",
        len(docs),
        stream.size,
        time.perf_counter() - started,
    )
    return stream


def _generate_batch(
    target, prompts: list[np.ndarray], max_new_tokens: int, device
) -> list[np.ndarray]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), EOT_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):  # left padding
        ids[row, width - len(prompt) :] = torch.from_numpy(prompt.astype(np.int64))
        mask[row, width - len(prompt) :] = 1
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        out = target.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=[IM_END_ID, EOT_ID],
            pad_token_id=EOT_ID,
        )
    new = out[:, width:].cpu().numpy()
    docs = []
    for prompt, tokens in zip(prompts, new, strict=True):
        stop = np.nonzero((tokens == IM_END_ID) | (tokens == EOT_ID))[0]
        end = int(stop[0]) + 1 if stop.size else len(tokens)
        docs.append(np.concatenate([prompt, tokens[:end]]))
    return docs
