"""Combiner inputs for calibration tests: one-hot guesses right ``accuracy`` of the time."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def one_hot_guesses(
    size: int, accuracy: float, seed: int = 0
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """(features [size, 8] with a 1 at each row's guess among 3 classes, true labels [size]);
    a wrong guess is the next class."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, size=size)
    guesses = np.where(rng.random(size) < accuracy, labels, (labels + 1) % 3)
    features = np.zeros((size, 8))
    features[np.arange(size), guesses] = 1.0
    return features, labels
