"""The second stage: a tiny MLP that weighs the last turn's scores against the context's.

The linear stage adds the two segments' scores, so a long code history outvotes "now write
a poem about autumn" (additive scores cannot say "a self-contained request overrides its
context"). The combiner reads both score vectors and the two segment sizes and decides:

    z = [scores of the last turn (3), scores of the context (3),
         log1p(n-grams of the last turn) / 8, log1p(n-grams of the context) / 8]      [8]
    probabilities = softmax(w2 @ relu(w1 @ z + b1) + b2)

It is fitted on out-of-fold linear scores (``training/classifier/stacking.py``), so it learns
how far to trust scores the linear stage gives to text it has not seen. Plain numpy; a few
microseconds. The native scorer computes the same inputs and MLP in C (``_ngram.c``,
``request_probabilities``; ``tests/classifier/test_native.py`` checks that both give the same
probabilities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

NUM_INPUTS = 8
# log1p(n-grams) / LENGTH_SCALE keeps the size inputs near the scale of the scores.
LENGTH_SCALE = 8.0

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Combiner:
    """``w1`` [hidden, 8], ``b1`` [hidden], ``w2`` [num_tasks, hidden], ``b2`` [num_tasks]."""

    w1: Array
    b1: Array
    w2: Array
    b2: Array

    def __post_init__(self) -> None:
        num_hidden = self.w1.shape[0]
        shapes = (self.w1.shape, self.b1.shape, self.w2.shape[1:], self.b2.shape)
        expected = ((num_hidden, NUM_INPUTS), (num_hidden,), (num_hidden,), self.w2.shape[:1])
        if shapes != expected:
            raise ValueError(f"combiner shapes {shapes} do not fit {expected}")

    def probabilities(self, inputs: Array) -> Array:
        hidden = self.w1 @ inputs
        hidden += self.b1
        np.maximum(hidden, 0.0, out=hidden)
        logits = self.w2 @ hidden
        logits += self.b2
        logits -= logits.max()
        np.exp(logits, out=logits)
        logits /= logits.sum()
        return logits

    def arrays(self) -> dict[str, Array]:
        return {"combiner_w1": self.w1, "combiner_b1": self.b1,
                "combiner_w2": self.w2, "combiner_b2": self.b2}  # fmt: skip


def combiner_inputs(
    focus_scores: Array, context_scores: Array, num_focus: int, num_context: int
) -> Array:
    """The 8 inputs of the combiner for one request (see the module docstring)."""
    inputs = np.empty(NUM_INPUTS)
    inputs[0:3] = focus_scores
    inputs[3:6] = context_scores
    inputs[6] = math.log1p(num_focus) / LENGTH_SCALE
    inputs[7] = math.log1p(num_context) / LENGTH_SCALE
    return inputs


def combiner_from_arrays(arrays: dict[str, Array]) -> Combiner | None:
    """The combiner stored in an artifact's arrays, or None when it has none."""
    if "combiner_w1" not in arrays:
        return None
    names = ("combiner_w1", "combiner_b1", "combiner_w2", "combiner_b2")
    w1, b1, w2, b2 = (np.asarray(arrays[name], dtype=np.float64) for name in names)
    return Combiner(w1, b1, w2, b2)
