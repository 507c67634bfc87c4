"""Fit the daemon's combiner (``controller/classifier/combiner.py``) on out-of-fold scores.

Scores the linear stage gives to its own training examples are over-confident, so the
training groups are split into ``num_folds`` folds (by hash, ``split.fold_of``); each fold is
scored by a linear model fitted on the others, and the MLP learns from those scores.
Training only: imports scikit-learn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from sklearn.linear_model import SGDClassifier
from sklearn.neural_network import MLPClassifier

from controller.classifier.combiner import LENGTH_SCALE, Combiner
from training.classifier.split import fold_of

logger = logging.getLogger(__name__)

MAX_COMBINER_ITERATIONS = 1000

Weights = npt.NDArray[np.float64] | None  # per-row sample weights; None: unweighted
FitLinear = Callable[[sp.csr_matrix, npt.NDArray[np.int64], Weights], SGDClassifier]


def segment_scores(model: SGDClassifier, segment: sp.csr_matrix) -> npt.NDArray[np.float64]:
    """[rows, num_tasks] scores of one segment, without bias, as the daemon computes them."""
    scores: npt.NDArray[np.float64] = np.asarray(segment @ model.coef_.T, dtype=np.float64)
    return scores


def combiner_features(
    model: SGDClassifier, segments: Sequence[sp.csr_matrix], sizes: Sequence[npt.NDArray[np.intp]]
) -> npt.NDArray[np.float64]:
    """[rows, 8]: focus scores, context scores, log1p of both segment sizes / LENGTH_SCALE."""
    lengths = np.log1p(np.stack(sizes, axis=1)) / LENGTH_SCALE
    return np.hstack(
        [segment_scores(model, segments[0]), segment_scores(model, segments[1]), lengths]
    )


def out_of_fold_features(
    segments: Sequence[sp.csr_matrix],
    sizes: Sequence[npt.NDArray[np.intp]],
    labels: npt.NDArray[np.int64],
    groups: Sequence[str],
    fit_linear: FitLinear,
    num_folds: int,
    weights: Weights = None,
) -> npt.NDArray[np.float64]:
    folds = np.array([fold_of(group, num_folds) for group in groups])
    whole = (segments[0] + segments[1]).tocsr()
    features = np.zeros((len(labels), 8))
    for fold in range(num_folds):
        is_in = folds == fold
        logger.info("combiner: linear model for fold %d of %d", fold + 1, num_folds)
        model = fit_linear(
            whole[~is_in], labels[~is_in], None if weights is None else weights[~is_in]
        )
        rows = [segment[is_in] for segment in segments]
        features[is_in] = combiner_features(model, rows, [size[is_in] for size in sizes])
    return features


# Temperatures tried by calibrate(): 0.25 to 4, evenly in log space.
TEMPERATURES = np.exp(np.linspace(np.log(0.25), np.log(4.0), 81))


def calibrated_combiner(
    features: npt.NDArray[np.float64],
    labels: npt.NDArray[np.int64],
    num_hidden: int,
    seed: int,
    weights: Weights = None,
    temperature_scale: float = 1.0,
) -> tuple[Combiner, float]:
    """The combiner, its logits divided by a temperature (folded into ``w2`` and ``b2``) so
    that its probabilities are calibrated, and that temperature.

    The temperature minimises the combiner's log loss on its own training rows: they are
    out-of-fold scores (the linear stage never saw them), and the MLP has a few hundred
    weights for tens of thousands of rows, so their loss is close to that on unseen rows.
    (A combiner fitted on 80% and calibrated on the other 20% doubled the fitting time, which
    on this 2-core machine is most of a training run.)

    ``temperature_scale`` multiplies that temperature: a hyper-parameter chosen on the
    validation split (``TrainSettings.temperature_scale``), for when unseen groups are
    calibrated at another temperature than the out-of-fold rows.
    """
    if not temperature_scale > 0:
        raise ValueError(f"temperature scale {temperature_scale!r}: must be > 0")
    combiner = fit_combiner(features, labels, num_hidden, seed, weights)
    temperature = fit_temperature(combiner, features, labels) * temperature_scale
    logger.info("combiner: temperature %.4f (scale %.4f)", temperature, temperature_scale)
    scaled = Combiner(
        combiner.w1, combiner.b1, combiner.w2 / temperature, combiner.b2 / temperature
    )
    return scaled, temperature


def combiner_logits(
    combiner: Combiner, features: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    hidden = np.maximum(features @ combiner.w1.T + combiner.b1, 0.0)
    logits: npt.NDArray[np.float64] = hidden @ combiner.w2.T + combiner.b2
    return logits


def fit_temperature(
    combiner: Combiner, features: npt.NDArray[np.float64], labels: npt.NDArray[np.int64]
) -> float:
    """The temperature of ``TEMPERATURES`` with the least log loss on ``features``."""
    logits = combiner_logits(combiner, features)
    losses = []
    for temperature in TEMPERATURES:
        scaled = logits / temperature
        scaled -= scaled.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(scaled).sum(axis=1))
        losses.append(float(np.mean(log_norm - scaled[np.arange(len(labels)), labels])))
    return float(TEMPERATURES[int(np.argmin(losses))])


def fit_combiner(
    features: npt.NDArray[np.float64],
    labels: npt.NDArray[np.int64],
    num_hidden: int,
    seed: int,
    weights: Weights = None,
) -> Combiner:
    """The MLP fitted full-batch with L-BFGS: on the validation split (docs/classifier.md)
    Adam's stochastic fit moved accuracy by up to 0.3 points between seeds with 8 hidden
    units; L-BFGS with 16 units moved it by 0.05 and was 0.4 points better on average."""
    mlp = MLPClassifier(
        hidden_layer_sizes=(num_hidden,),
        alpha=1e-4,
        solver="lbfgs",
        max_iter=MAX_COMBINER_ITERATIONS,
        random_state=seed,
    )
    mlp.fit(features, labels, sample_weight=weights)
    w1, w2 = (np.asarray(c, dtype=np.float64).T for c in mlp.coefs_)
    b1, b2 = (np.asarray(b, dtype=np.float64) for b in mlp.intercepts_)
    return Combiner(w1, b1, w2, b2)
