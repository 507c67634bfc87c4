"""The GPU stage: target pretraining, target continuations, drafts, export, in one process.

Writes (under out_dir): target/, draft<B>/ for every block size, train.json (sizes, times,
losses, training-set acceptance estimates). One call of the device tool runs this end to end.
"""

import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from training.batches import WindowSampler, load_stream
from training.draft import train_drafts
from training.export import export_draft, export_target, finish_target_dir
from training.generate import continuations
from training.recipe import Recipe, as_dict
from training.target import train_target

log = logging.getLogger(__name__)


def train_pair(recipe: Recipe, work_dir: Path, out_dir: Path) -> dict:
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    corpus_dir = work_dir / "corpus"
    vocab_size = Tokenizer.from_file(
        str(work_dir / "tokenizer" / "tokenizer.json")
    ).get_vocab_size()
    (work_dir / "state").mkdir(parents=True, exist_ok=True)
    target, target_stats = train_target(recipe, corpus_dir, work_dir / "state", vocab_size, device)
    export_target(target, out_dir / "target")
    finish_target_dir(out_dir / "target", work_dir / "tokenizer")
    generated = _continuations(recipe, target, corpus_dir, work_dir / "state", device)
    sampler = WindowSampler(
        load_stream(corpus_dir / "train.bin"),
        recipe.draft.train.seq_len,
        recipe.seed + 7,
        generated,
        recipe.draft.generated_fraction,
    )
    trainers, draft_stats = train_drafts(recipe, target, sampler, work_dir / "state", device)
    for trainer in trainers:
        export_draft(trainer.model, trainer.config, out_dir / f"draft{trainer.block_size}")
    stats = {
        "recipe": as_dict(recipe),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "target": target_stats,
        "continuation_tokens": int(generated.size),
        "drafts": draft_stats,
        "total_time_s": round(time.perf_counter() - started, 1),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def _continuations(recipe, target, corpus_dir: Path, state_dir: Path, device) -> np.ndarray:
    path = state_dir / "continuations.bin"
    if path.exists():  # resumable: reuse what an earlier run generated
        return load_stream(path)
    try:
        stream = continuations(recipe, target, corpus_dir, device)
    except Exception:  # the drafts can still train on the corpus alone; say so loudly
        log.exception("continuations failed; drafts train on corpus rows only")
        return np.zeros(0, np.uint16)
    stream.tofile(path)
    return stream
