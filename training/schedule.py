"""Learning rate as a function of training progress (warm-up, then cosine to min_lr_ratio).

Progress is the larger of steps/max_steps and elapsed/time_budget_s, so a run given a
wall-clock budget still ends its schedule at the budget.
"""

import math

from training.recipe import TrainConfig


def progress(cfg: TrainConfig, step: int, elapsed_s: float) -> float:
    return min(1.0, max(step / cfg.max_steps, elapsed_s / cfg.time_budget_s))


def learning_rate(cfg: TrainConfig, step: int, elapsed_s: float) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress(cfg, step, elapsed_s)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)
