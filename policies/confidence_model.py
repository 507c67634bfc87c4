"""A synthetic draft confidence with a chosen predictive power, for benchmarks and simulation
(issue 16): the engine's synthetic-acceptance mode and the simulator draw it the same way.

Per drafted position, ``c = sigmoid(CONFIDENCE_BIAS + separation * (y - 1/2) + e)`` with
``e ~ N(0, 1)`` and ``y`` = 1 if the position survives this step (it lies before the step's
accepted run ends), else 0. With unit noise the AUC of c against y is
``Phi(separation / sqrt(2))``, so ``separation = sqrt(2) * Phi^-1(auc)``. The callers bring
their own noise (the engine a counter-based hash, the simulator a seeded ``random.Random``), so
each stays deterministic per (seed, request, step). Pure; no I/O.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TypeVar

import numpy as np

CONFIDENCE_BIAS = 1.0  # log-odds of a position's confidence halfway between the two classes

Value = TypeVar("Value", float, np.ndarray)


def separation(auc: float) -> float:
    """The gap between the two classes' mean log-odds that gives ``auc`` under unit noise."""
    if not 0.5 <= auc < 1.0:
        raise ValueError(f"confidence AUC must be in [0.5, 1), got {auc}")
    return math.sqrt(2.0) * NormalDist().inv_cdf(auc)


def confidence_logit(survives: Value, noise: Value, gap: float) -> Value:
    """The confidence's log-odds (elementwise: floats or arrays of the same shape)."""
    return CONFIDENCE_BIAS + gap * (survives - 0.5) + noise


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` against boolean ``labels`` (ties count half):
    the probability that a random positive outscores a random negative."""
    scores, labels = np.asarray(scores, dtype=np.float64).ravel(), np.asarray(labels).ravel()
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs both labels")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size)
    sorted_scores = scores[order]
    # average ranks over ties (1-based)
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    mean_rank = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(mean_rank, counts)
    total = ranks[labels.astype(bool)].sum()
    return float((total - positives * (positives + 1) / 2.0) / (positives * negatives))
