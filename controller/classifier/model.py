"""The built-in classifier: a linear model over hashed byte n-grams, in plain numpy.

Features are bucket counts divided by sqrt(N), N the number of n-grams of a segment, so
scoring a request is ``logits = sum over segments of weights[:, buckets].sum(axis=1) / sqrt(N)
+ bias``, no counting needed (segments: ``features.request_buckets``). The
model is one-vs-rest logistic regression; probabilities are each class's sigmoid,
normalised to sum to one (as scikit-learn's ``predict_proba`` does for one-vs-rest).
``np.take(weights, buckets, axis=1)`` on the [num_tasks, num_buckets] matrix is the fastest
gather measured here (34 us at 4,000 characters; a take per class row 51 us, a fancy index of
the transposed matrix 300 us).

Two scorers compute the same scores. ``native`` (``_ngram.c``: one C call hashes and sums
both segments and runs the combiner) is used when the extension was built and
``DRAFTCTL_CLASSIFIER_NATIVE`` is not ``0``; ``numpy`` otherwise. The native one exists for
the cold cost: after the process has slept, each of the numpy path's ~25 numpy calls pays a
large cache-miss penalty (docs/classifier.md, "Native scorer").
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from controller.classifier.base import TaskGuess, uniform_scores
from controller.classifier.combiner import LENGTH_SCALE, Combiner, combiner_inputs
from controller.classifier.features import (
    SHAPE_SEGMENT_OFFSET,
    SHAPE_TABLE,
    WORD_MODES,
    FeatureSpec,
    byte_buckets,
    request_texts,
    shape_buckets,
    text_bytes,
    unigram_buckets,
    word_buckets,
)
from controller.classifier.text import DEFAULT_MAX_CHARS
from policies.types import Task

try:
    from controller.classifier._ngram import request_probabilities, segment_sums

    HAS_NATIVE = True
except ImportError:  # installed without a C compiler: the numpy scorer only
    HAS_NATIVE = False

NATIVE_ENV = "DRAFTCTL_CLASSIFIER_NATIVE"
Scorer = Literal["native", "numpy"]


def default_scorer() -> Scorer:
    """``native`` when the extension is built and ``DRAFTCTL_CLASSIFIER_NATIVE`` is not 0."""
    return "native" if HAS_NATIVE and os.environ.get(NATIVE_ENV, "1") != "0" else "numpy"


class LinearClassifier:
    """Implements :class:`controller.classifier.base.Classifier`.

    ``weights`` has shape [num_tasks, num_buckets] and ``bias`` [num_tasks], rows in the
    order of ``tasks``. With a ``combiner`` (segmented specs only), the per-segment scores
    go through it instead of being added (``combiner.py``). ``scorer`` picks the scoring
    code (module docstring); None means :func:`default_scorer`.
    """

    def __init__(
        self,
        spec: FeatureSpec,
        tasks: tuple[Task, ...],
        weights: npt.NDArray[np.float32],
        bias: npt.NDArray[np.float32],
        max_chars: int = DEFAULT_MAX_CHARS,
        combiner: Combiner | None = None,
        scorer: Scorer | None = None,
    ) -> None:
        if scorer == "native" and not HAS_NATIVE:
            raise ValueError(
                "scorer 'native' needs controller.classifier._ngram, which was not built; "
                "reinstall with a C compiler (`pip install -e .`) or use scorer 'numpy'"
            )
        if combiner is not None and not spec.is_segmented:
            raise ValueError("a combiner needs a segmented feature spec")
        expected = (len(tasks), spec.num_buckets)
        if weights.shape != expected or bias.shape != (len(tasks),):
            raise ValueError(f"weights {weights.shape} / bias {bias.shape} do not fit {expected}")
        self.spec = spec
        self.tasks = tasks
        self.weights = np.ascontiguousarray(weights, dtype=np.float32)
        self.bias = bias.astype(np.float64)
        self.max_chars = max_chars
        self.combiner = combiner
        # 1-grams are scored from a byte histogram: bincount + a [tasks, 256] product costs
        # less than gathering a weight column per byte (same sum, ~1/3 fewer gathers).
        self.gathered_sizes = tuple(n for n in spec.ngram_sizes if n != 1)
        self.unigram_weights = [
            self.weights[:, unigram_buckets(spec, segment)] if 1 in spec.ngram_sizes else None
            for segment in range(2 if spec.is_segmented else 1)
        ]
        self.scorer: Scorer = scorer or default_scorer()
        # The native calls read memoryviews: exporting a buffer from a memoryview cost ~10 us
        # less than from a numpy array after a sleep (docs/classifier.md, "Native scorer").
        self._weights_view = self.weights.data
        # C-contiguous float64 (a fitted combiner's arrays may be views).
        self._mlp_views = tuple(
            np.ascontiguousarray(array, dtype=np.float64).data
            for array in (combiner.w1, combiner.b1, combiner.w2, combiner.b2)
        ) if combiner is not None else ()  # fmt: skip

    def classify(self, body: Mapping[str, Any]) -> TaskGuess:
        start_s = time.perf_counter()
        return self._guess(request_texts(body, self.spec, self.max_chars), start_s)

    def classify_text(self, text: str) -> TaskGuess:
        """Classify already-extracted text as a last user turn with no context."""
        return self.classify_segments([text, ""] if self.spec.is_segmented else [text])

    def classify_segments(self, texts: list[str]) -> TaskGuess:
        """Classify the text of each segment; no n-gram at all is chat with confidence 0."""
        return self._guess(texts, time.perf_counter())

    def _guess(self, texts: list[str], start_s: float) -> TaskGuess:
        """:meth:`classify_segments`, its latency counted from ``start_s``."""
        if self.scorer == "native":
            probabilities = self.native_probabilities(texts)
        else:
            scored = [self.segment_scores(text, segment) for segment, text in enumerate(texts)]
            has_ngrams = any(num_ngrams for _, num_ngrams in scored)
            probabilities = self.probabilities(scored).tolist() if has_ngrams else None
        if probabilities is None:
            return TaskGuess(Task.CHAT, 0.0, uniform_scores(), time.perf_counter() - start_s)
        confidence = max(probabilities)
        task = self.tasks[probabilities.index(confidence)]  # the first best, as np.argmax
        scores = dict(zip(self.tasks, probabilities, strict=True))
        return TaskGuess(task, confidence, scores, time.perf_counter() - start_s)

    def native_probabilities(self, texts: list[str]) -> list[float] | None:
        """The native scorer's probabilities; None when no segment has an n-gram."""
        spec = self.spec
        if self.combiner is not None:  # the built-in model: one C call for the whole request
            focus, context = [text.lower() for text in texts] if spec.is_lowercase else texts
            w1, b1, w2, b2 = self._mlp_views
            return request_probabilities(
                focus, context, self._weights_view, spec.num_bits, spec.ngram_sizes,
                LENGTH_SCALE, w1, b1, w2, b2, SHAPE_TABLE, spec.shape_sizes,
                WORD_MODES[spec.word_view],
            )  # fmt: skip
        scored = [self.native_segment_scores(text, segment) for segment, text in enumerate(texts)]
        if not any(num_ngrams for _, num_ngrams in scored):
            return None
        arrays = [(np.array(scores), num_ngrams) for scores, num_ngrams in scored]
        result: list[float] = self.probabilities(arrays).tolist()
        return result

    def native_segment_scores(self, text: str, segment: int) -> tuple[list[float], int]:
        """:meth:`segment_scores` computed by ``_ngram.segment_sums``, as Python floats."""
        if self.spec.is_lowercase:
            text = text.lower()
        data = text.encode("utf-8", "replace")  # as features.text_bytes encodes
        spec = self.spec
        sums, num_ngrams = segment_sums(
            data, self._weights_view, spec.num_bits, spec.ngram_sizes, segment
        )
        if spec.shape_sizes:
            shape_sums, num_shape = segment_sums(
                data.translate(SHAPE_TABLE), self._weights_view, spec.num_bits,
                spec.shape_sizes, segment + SHAPE_SEGMENT_OFFSET,
            )  # fmt: skip
            sums = tuple(a + b for a, b in zip(sums, shape_sums, strict=True))
            num_ngrams += num_shape
        scale = 1.0 / math.sqrt(num_ngrams) if num_ngrams else 0.0
        scores = [total * scale for total in sums]
        if spec.word_view and num_ngrams:
            words = self.word_scores(np.frombuffer(data, dtype=np.uint8), segment)
            scores = [score + float(word) for score, word in zip(scores, words, strict=True)]
        return scores, num_ngrams

    def probabilities(
        self, scored: Sequence[tuple[npt.NDArray[np.float64], int]]
    ) -> npt.NDArray[np.float64]:
        if self.combiner is not None:
            (focus, num_focus), (context, num_context) = scored
            return self.combiner.probabilities(
                combiner_inputs(focus, context, num_focus, num_context)
            )
        logits = self.bias + sum(scores for scores, _ in scored)
        # Each class's sigmoid, normalised; in log space, so that very negative logits
        # neither overflow exp nor all round to 0 (0 / 0).
        log_sigmoid = -np.logaddexp(0.0, -logits)
        result: npt.NDArray[np.float64] = np.exp(log_sigmoid - log_sigmoid.max())
        result /= result.sum()
        return result

    def segment_scores(self, text: str, segment: int) -> tuple[npt.NDArray[np.float64], int]:
        """``(weights[:, buckets].sum(axis=1) / sqrt(N), N)`` over the text's N n-grams, no
        bias; zeros for a text without n-grams."""
        data = text_bytes(text, self.spec) if text else None
        if data is None or not data.size:
            return np.zeros(len(self.tasks)), 0
        buckets = byte_buckets(data, self.spec, segment, self.gathered_sizes)
        # float32 accumulation (pairwise) is ~8 us faster than float64 at 4,000 characters.
        sums = np.take(self.weights, buckets, axis=1).sum(axis=1).astype(np.float64)
        num_ngrams = buckets.size
        unigram_weights = self.unigram_weights[segment]
        if unigram_weights is not None:
            sums += unigram_weights @ np.bincount(data, minlength=256).astype(np.float32)
            num_ngrams += data.size
        if self.spec.shape_sizes:
            shape = shape_buckets(data, self.spec, segment)
            sums += np.take(self.weights, shape, axis=1).sum(axis=1).astype(np.float64)
            num_ngrams += shape.size
        if not num_ngrams:
            return np.zeros(len(self.tasks)), 0
        result: npt.NDArray[np.float64] = sums / np.sqrt(num_ngrams)
        if self.spec.word_view:
            result += self.word_scores(data, segment)
        return result, num_ngrams

    def word_scores(self, data: npt.NDArray[np.uint8], segment: int) -> npt.NDArray[np.float64]:
        """The word view's score of a segment's bytes: its words' weight columns summed, /
        sqrt(number of words); zeros without words (features docstring)."""
        words = word_buckets(data, self.spec, segment)
        if not words.size:
            return np.zeros(len(self.tasks))
        sums = np.take(self.weights, words, axis=1).sum(axis=1).astype(np.float64)
        result: npt.NDArray[np.float64] = sums / np.sqrt(words.size)
        return result
