"""Stage 3c: train DFlash drafts (one per block size) on a frozen target.

Per batch the target runs once (no grad); its hidden states at target_layer_ids are the context
features and its next-token distribution is the soft label: the draft learns to propose what the
*target* would emit, which is what acceptance measures. Rows come from the corpus and from the
target's own greedy continuations (stage 3b). Loss weights decay along the block,
w_i = exp(-(i-1)/gamma), as in the DFlash paper: an early miss ends the accepted run.
"""

import json
import logging
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import Qwen3Config, Qwen3ForCausalLM

from training.batches import WindowSampler
from training.chat import MASK, SPECIAL_TOKENS
from training.draft_model import DFlashDraft, block_mask, block_positions
from training.recipe import DraftConfig, Recipe
from training.schedule import learning_rate, progress
from training.target import build_optimizer

log = logging.getLogger(__name__)
MASK_ID = SPECIAL_TOKENS.index(MASK)


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Same spacing as dflash.model.build_target_layer_ids."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [
        round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)
    ]


def draft_config_dict(target: Qwen3Config, cfg: DraftConfig, block_size: int) -> dict:
    layer_ids = cfg.target_layer_ids or build_target_layer_ids(
        target.num_hidden_layers, cfg.num_layers
    )
    config = target.to_dict()
    config.update(
        architectures=["DFlashDraftModel"],
        num_hidden_layers=cfg.num_layers,
        layer_types=["full_attention"] * cfg.num_layers,
        num_target_layers=target.num_hidden_layers,
        tie_word_embeddings=False,
        dflash_config={
            "block_size": block_size,
            "target_layer_ids": layer_ids,
            "mask_token_id": MASK_ID,
        },
    )
    return config


class FeatureTap:
    """Forward hooks that keep the outputs of the target's decoder layers `layer_ids`."""

    def __init__(self, target: Qwen3ForCausalLM, layer_ids: list[int]):
        self.outputs: dict[int, torch.Tensor] = {}
        self.layer_ids = layer_ids
        for i in layer_ids:
            target.model.layers[i].register_forward_hook(self._hook(i))

    def _hook(self, index: int):
        def hook(_module, _inputs, output):
            self.outputs[index] = output[0] if isinstance(output, tuple) else output

        return hook

    def features(self) -> torch.Tensor:
        return torch.cat([self.outputs[i] for i in self.layer_ids], dim=-1)


class DraftTrainer:
    def __init__(self, config: dict, cfg: DraftConfig, device, seed: int):
        torch.manual_seed(seed)
        self.block_size = config["dflash_config"]["block_size"]
        self.config = config
        self.model = DFlashDraft(
            Qwen3Config(**config), config["dflash_config"]["target_layer_ids"]
        ).to(device)
        self.optimizer = build_optimizer(self.model, cfg.train.lr, cfg.train.weight_decay)
        gamma = cfg.loss_decay_gamma or (7.0 if self.block_size >= 16 else 5.0)
        slots = torch.arange(1, self.block_size, device=device, dtype=torch.float32)
        self.weights = torch.exp(-(slots - 1) / gamma)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.history: list[dict] = []

    def anchors(self, batch: int, seq_len: int, num: int, device) -> torch.Tensor:
        """(batch, num) sorted distinct anchor positions in [1, seq_len - block_size]."""
        scores = torch.rand(batch, seq_len - self.block_size, generator=self.generator)
        return (scores.topk(num, dim=1).indices + 1).sort(dim=1).values.to(device)

    def step(self, ids, features, target_logp, embed, lm_head, num_anchors, lr):
        b, seq_len = ids.shape
        B = self.block_size
        anchors = self.anchors(b, seq_len, num_anchors, ids.device)  # (b, n)
        slots = block_positions(anchors, B)  # (b, n*B)
        block_ids = torch.full_like(slots, MASK_ID)
        block_ids[:, ::B] = ids.gather(1, anchors)
        context_pos = torch.arange(seq_len, device=ids.device).expand(b, -1)
        hidden = self.model(
            embed(block_ids), features, slots, context_pos, block_mask(anchors, seq_len, B)
        )
        hidden = hidden.view(b, -1, B, hidden.shape[-1])[:, :, 1:]  # slots predicting x[a+i]
        logp = torch.log_softmax(lm_head(hidden).float(), dim=-1)  # (b, n, B-1, V)
        # Target's distribution for x[a+i] is its output at position a+i-1.
        source = (slots.view(b, -1, B)[:, :, 1:] - 1).flatten(1)
        teacher = target_logp[torch.arange(b, device=ids.device)[:, None], source].view_as(logp)
        loss = -(teacher.exp() * logp).sum(-1)  # soft cross-entropy, (b, n, B-1)
        loss = (loss * self.weights).sum() / (self.weights.sum() * b * anchors.shape[1])
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        match = logp.argmax(-1) == teacher.argmax(-1)
        return loss.detach(), match.int().cumprod(-1).sum(-1).float().mean() + 1.0


def train_drafts(
    recipe: Recipe, target: Qwen3ForCausalLM, sampler: WindowSampler, work_dir: Path, device
):
    cfg = recipe.draft
    train_cfg = cfg.train
    target.eval().requires_grad_(False)
    trainers = [
        DraftTrainer(draft_config_dict(target.config, cfg, bs), cfg, device, recipe.seed + bs)
        for bs in cfg.block_sizes
    ]
    tap = FeatureTap(target, trainers[0].config["dflash_config"]["target_layer_ids"])
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    ckpt_path = work_dir / "drafts.ckpt"
    step, elapsed = _resume(ckpt_path, trainers, sampler)
    bar = tqdm(desc="drafts", unit="step", initial=step, mininterval=5)
    while progress(train_cfg, step, elapsed) < 1.0:
        start = time.perf_counter()
        lr = learning_rate(train_cfg, step, elapsed)
        ids = sampler.sample(train_cfg.batch_size, device)[:, :-1]
        with (
            torch.no_grad(),
            torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"),
        ):
            target_logp = torch.log_softmax(target(input_ids=ids).logits.float(), dim=-1)
            features = tap.features()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            results = [
                t.step(ids, features, target_logp, embed, lm_head, cfg.num_anchors, lr)
                for t in trainers
            ]
        step += 1
        if step % train_cfg.checkpoint_every == 0:
            _save(ckpt_path, trainers, sampler, step, elapsed)
        if step % 50 == 0:
            for trainer, (loss, tau) in zip(trainers, results, strict=True):
                trainer.history.append(
                    {
                        "step": step,
                        "loss": round(loss.item(), 4),
                        "train_accept_len": round(tau.item(), 3),
                    }
                )
            bar.set_postfix(
                {f"tau{t.block_size}": t.history[-1]["train_accept_len"] for t in trainers}
            )
        elapsed += time.perf_counter() - start
        bar.update(1)
    bar.close()
    _save(ckpt_path, trainers, sampler, step, elapsed)
    stats = {
        f"block{t.block_size}": {
            "steps": step,
            "train_time_s": round(elapsed, 1),
            "parameters": sum(p.numel() for p in t.model.parameters()),
            "final": t.history[-1] if t.history else None,
            "history": t.history,
        }
        for t in trainers
    }
    (work_dir / "drafts.json").write_text(json.dumps(stats, indent=2) + "\n")
    log.info("drafts done: %s", {k: v["final"] for k, v in stats.items()})
    return trainers, stats


def _save(
    path: Path, trainers: list[DraftTrainer], sampler: WindowSampler, step: int, elapsed: float
):
    state = {
        "step": step,
        "elapsed": elapsed,
        "sampler": sampler.state(),
        "trainers": [
            {"model": t.model.state_dict(), "optimizer": t.optimizer.state_dict(),
             "generator": t.generator.get_state(), "history": t.history}
            for t in trainers
        ],
    }  # fmt: skip
    torch.save(state, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)


def _resume(path: Path, trainers: list[DraftTrainer], sampler: WindowSampler) -> tuple[int, float]:
    """Continue from a checkpoint of the same block sizes; start fresh without one."""
    if not path.exists():
        return 0, 0.0
    state = torch.load(path, map_location="cpu", weights_only=False)
    if len(state["trainers"]) != len(trainers):
        raise ValueError(f"{path}: checkpoint has {len(state['trainers'])} drafts, the recipe "
                         f"{len(trainers)}; delete it to retrain the drafts")  # fmt: skip
    for trainer, saved in zip(trainers, state["trainers"], strict=True):
        trainer.model.load_state_dict(saved["model"])
        trainer.optimizer.load_state_dict(saved["optimizer"])
        trainer.generator.set_state(saved["generator"])
        trainer.history = saved["history"]
    sampler.restore(state["sampler"])
    return state["step"], state["elapsed"]
