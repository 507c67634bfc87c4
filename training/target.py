"""Stage 3a: pretrain the Qwen3 target (transformers' Qwen3ForCausalLM) on the token stream.

Resumable: a checkpoint (model, optimizer, sampler state, step, elapsed time) is written every
`checkpoint_every` steps and at the end; a rerun continues from it.
"""

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import Qwen3Config, Qwen3ForCausalLM

from training.batches import WindowSampler, load_stream
from training.chat import SPECIAL_TOKENS
from training.recipe import Recipe, TargetConfig
from training.schedule import learning_rate, progress

log = logging.getLogger(__name__)


def target_config(cfg: TargetConfig, vocab_size: int) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index("<|im_end|>"),
        pad_token_id=SPECIAL_TOKENS.index("<|endoftext|>"),
        architectures=["Qwen3ForCausalLM"],
    )


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = torch.cuda.is_available()
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


def lm_loss(model: Any, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


@torch.no_grad()
def validation_loss(
    model: Qwen3ForCausalLM, sampler: WindowSampler, device, num_batches=8
) -> float:
    model.eval()
    losses = []
    for _ in range(num_batches):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            losses.append(lm_loss(model, sampler.sample(32, device)).item())
    model.train()
    return sum(losses) / len(losses)


def train_target(
    recipe: Recipe, corpus_dir: Path, work_dir: Path, vocab_size: int, device
) -> tuple[Qwen3ForCausalLM, dict]:
    cfg = recipe.target_train
    torch.manual_seed(recipe.seed)
    model = Qwen3ForCausalLM(target_config(recipe.target, vocab_size)).to(device)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    train = WindowSampler(load_stream(corpus_dir / "train.bin"), cfg.seq_len, recipe.seed)
    val = WindowSampler(load_stream(corpus_dir / "val.bin"), cfg.seq_len, recipe.seed + 1)
    ckpt_path = work_dir / "target.ckpt"
    step, elapsed = _resume(ckpt_path, model, optimizer, train)
    forward = torch.compile(model) if cfg.compile else model
    num_params = sum(p.numel() for p in model.parameters())
    log.info("target: %.2fM parameters, resuming at step %d", num_params / 1e6, step)
    bar = tqdm(desc="target", unit="step", initial=step, mininterval=5)
    history = []
    while progress(cfg, step, elapsed) < 1.0:
        start = time.perf_counter()
        lr = learning_rate(cfg, step, elapsed)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = lm_loss(forward, train.sample(cfg.batch_size, device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % 50 == 0:
            value = loss.item()  # host sync only every 50 steps
            history.append({"step": step, "loss": round(value, 4), "elapsed_s": round(elapsed, 1)})
            bar.set_postfix(loss=f"{value:.3f}", lr=f"{lr:.2e}")
        if step % cfg.checkpoint_every == 0:
            _save(ckpt_path, model, optimizer, train, step, elapsed)
        if device.type == "cuda" and step % 50 == 0:
            torch.cuda.synchronize()
        elapsed += time.perf_counter() - start
        bar.update(1)
    bar.close()
    _save(ckpt_path, model, optimizer, train, step, elapsed)
    tokens = step * cfg.batch_size * cfg.seq_len
    stats = {
        "parameters": num_params,
        "steps": step,
        "tokens": tokens,
        "train_time_s": round(elapsed, 1),
        "tokens_per_s": round(tokens / max(elapsed, 1e-9)),
        "val_loss": round(validation_loss(model, val, device), 4),
        "history": history,
    }
    stats["val_ppl"] = round(math.exp(stats["val_loss"]), 2)
    log.info("target done: %s", {k: v for k, v in stats.items() if k != "history"})
    (work_dir / "target.json").write_text(json.dumps(stats, indent=2) + "\n")
    return model, stats


def _save(path: Path, model, optimizer, sampler: WindowSampler, step: int, elapsed: float) -> None:
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "sampler": sampler.state(),
        "step": step,
        "elapsed": elapsed,
    }
    torch.save(state, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)


def _resume(path: Path, model, optimizer, sampler: WindowSampler) -> tuple[int, float]:
    if not path.exists():
        return 0, 0.0
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.restore(state["sampler"])
    return state["step"], state["elapsed"]
