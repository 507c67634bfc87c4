"""Held-out accuracy, per-class precision/recall, confusion matrix and latency."""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller.classifier.base import Classifier, TaskGuess
from controller.classifier.text import request_segments
from policies.types import TASKS, Task
from training.classifier.corpus import Example
from training.classifier.prompt_sets import request_tags


@dataclass
class EvalReport:
    """Counts over the held-out examples; ``confusion[(true, predicted)]``."""

    num_examples: int = 0
    num_correct: int = 0
    confusion: Counter[tuple[Task, Task]] = field(default_factory=Counter)
    per_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [correct, total]
    latencies_s: list[float] = field(default_factory=list)
    # category -> value -> [correct, total] (prompt_sets.request_tags)
    per_category: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    # (confidence, is correct) of every guess, for the calibration error
    confidences: list[tuple[float, bool]] = field(default_factory=list)
    scorer: str = "n/a"  # controller.classifier LinearClassifier.scorer: "native" or "numpy"

    @property
    def accuracy(self) -> float:
        return self.num_correct / self.num_examples if self.num_examples else 0.0

    def precision(self, task: Task) -> float:
        predicted = sum(self.confusion[(truth, task)] for truth in TASKS)
        return self.confusion[(task, task)] / predicted if predicted else 0.0

    def recall(self, task: Task) -> float:
        actual = sum(self.confusion[(task, guess)] for guess in TASKS)
        return self.confusion[(task, task)] / actual if actual else 0.0


def evaluate(classifier: Classifier, examples: Sequence[Example]) -> EvalReport:
    """Classify every example once; latency is the wall time around ``classify``."""
    report = EvalReport(scorer=getattr(classifier, "scorer", "n/a"))
    for example in examples:
        start_s = time.perf_counter()
        guess = classifier.classify(example.body)
        report.latencies_s.append(time.perf_counter() - start_s)
        is_correct = guess.task == example.task
        report.num_examples += 1
        report.num_correct += is_correct
        report.confusion[(example.task, guess.task)] += 1
        tally = report.per_source.setdefault(f"{example.source} ({example.task})", [0, 0])
        tally[0] += is_correct
        tally[1] += 1
        report.confidences.append((guess.confidence, is_correct))
        for name, value in (*request_tags(example), ("task", str(example.task))):
            cell = report.per_category.setdefault(name, {}).setdefault(value, [0, 0])
            cell[0] += is_correct
            cell[1] += 1
    return report


def calibration_error(confidences: Sequence[tuple[float, bool]], num_bins: int = 10) -> float:
    """Expected calibration error: the mean over equal-width confidence bins of |accuracy -
    mean confidence|, weighted by the bin's share of the guesses."""
    if not confidences:
        return 0.0
    bins: dict[int, list[tuple[float, bool]]] = {}
    for confidence, is_correct in confidences:
        bins.setdefault(min(int(confidence * num_bins), num_bins - 1), []).append(
            (confidence, is_correct)
        )
    total = 0.0
    for members in bins.values():
        accuracy = sum(is_correct for _, is_correct in members) / len(members)
        mean_confidence = sum(confidence for confidence, _ in members) / len(members)
        total += len(members) * abs(accuracy - mean_confidence)
    return total / len(confidences)


def long_prompt_latencies_s(
    classifier: Classifier, texts: Sequence[str], num_chars: int, num_requests: int = 2000
) -> list[float]:
    """Latency of ``classify`` on prompts of ``num_chars`` made by joining real texts."""
    prompts: list[str] = []
    pieces: list[str] = []
    for text in texts:
        pieces.append(text)
        if sum(len(piece) + 1 for piece in pieces) >= num_chars:
            prompts.append("\n".join(pieces)[:num_chars])
            pieces = []
    if not prompts:
        return []
    latencies_s = []
    for index in range(num_requests):
        body = {"messages": [{"role": "user", "content": prompts[index % len(prompts)]}]}
        start_s = time.perf_counter()
        classifier.classify(body)
        latencies_s.append(time.perf_counter() - start_s)
    return latencies_s


def source_noise(correct: int, total: int) -> float:
    """Two standard errors of an accuracy measured on ``total`` requests (Agresti-Coull: two
    successes and two failures added, so 100% on n requests still has a width): how far the
    figure would move on another sample of the same size."""
    p = (correct + 2) / (total + 4)
    return 2 * math.sqrt(p * (1 - p) / (total + 4))


def by_source(report: EvalReport) -> dict[str, list[int]]:
    """``per_source`` summed over labels: source -> [correct, total]."""
    out: dict[str, list[int]] = {}
    for key, (correct, total) in report.per_source.items():
        tally = out.setdefault(key.rsplit(" (", 1)[0], [0, 0])
        tally[0] += correct
        tally[1] += total
    return out


def report_json(report: EvalReport) -> dict[str, Any]:
    """The report as the committed evaluation JSON: per source (and per source and label)
    the counts, the accuracy and its noise (``source_noise``), per class precision and recall,
    the confusion matrix."""

    def cells(tallies: dict[str, list[int]]) -> dict[str, dict[str, float | int]]:
        return {
            name: {
                "correct": correct,
                "total": total,
                "accuracy": correct / total,
                "noise": source_noise(correct, total),
            }
            for name, (correct, total) in sorted(tallies.items())
        }

    real = [t for name, t in by_source(report).items() if not name.startswith("synth")]
    return {
        "examples": report.num_examples,
        "accuracy": report.accuracy,
        "real_examples": sum(total for _, total in real),
        "real_accuracy": sum(c for c, _ in real) / max(1, sum(t for _, t in real)),
        "scorer": report.scorer,
        "sources": cells(by_source(report)),
        "sources_by_label": cells(report.per_source),
        "classes": {
            str(task): {"precision": report.precision(task), "recall": report.recall(task)}
            for task in TASKS
        },
        "confusion": {
            str(truth): {str(guess): report.confusion[(truth, guess)] for guess in TASKS}
            for truth in TASKS
        },
        "categories": {name: cells(values) for name, values in sorted(report.per_category.items())},
        "calibration_error": calibration_error(report.confidences),
    }


def format_latency(label: str, latencies_s: Sequence[float]) -> str:
    if not latencies_s:
        return f"{label}: no samples"
    p50_us, p99_us = np.percentile(latencies_s, [50, 99]) * 1e6
    return f"{label}: p50 {p50_us:.1f} us  p99 {p99_us:.1f} us  (n={len(latencies_s)})"


def format_report(report: EvalReport, has_latency: bool = True) -> str:
    real = [tally for source, tally in report.per_source.items() if not source.startswith("synth")]
    num_real = sum(total for _, total in real)
    real_accuracy = sum(correct for correct, _ in real) / num_real if num_real else 0.0
    lines = [
        f"held-out examples: {report.num_examples}  accuracy: {report.accuracy:.2%}",
        f"real sources (no synthetic_*): {num_real}  accuracy: {real_accuracy:.2%}",
        f"scorer: {report.scorer} (DRAFTCTL_CLASSIFIER_NATIVE=0 forces numpy)",
        "",
    ]
    lines.append(f"{'source (label)':34} {'n':>6} {'accuracy':>9}")
    for source, (correct, total) in sorted(report.per_source.items()):
        lines.append(f"{source:34} {total:6d} {correct / total:9.2%}")
    lines += ["", f"{'class':6} {'precision':>9} {'recall':>7}"]
    for task in TASKS:
        lines.append(f"{task:6} {report.precision(task):9.2%} {report.recall(task):7.2%}")
    header = " " * 6 + "".join(f"{task:>8}" for task in TASKS)
    lines += ["", "confusion (rows: true, columns: predicted)", header]
    for truth in TASKS:
        lines.append(f"{truth:6}" + "".join(f"{report.confusion[(truth, g)]:8d}" for g in TASKS))
    lines += ["", f"calibration error (ECE, 10 bins): {calibration_error(report.confidences):.2%}"]
    lines += format_categories(report)
    if has_latency:
        lines += ["", format_latency("latency per held-out request", report.latencies_s)]
    return "\n".join(lines)


def format_categories(report: EvalReport) -> list[str]:
    """Accuracy per value of each category, largest first (values under 5 requests pooled
    into 'other (<5 each)')."""
    lines = []
    for name, values in sorted(report.per_category.items()):
        small = [0, 0]
        cells = []
        for value, (correct, total) in sorted(values.items(), key=lambda item: -item[1][1]):
            if total < 5 and len(values) > 12:
                small = [small[0] + correct, small[1] + total]
            else:
                cells.append(f"{value} {correct}/{total} {correct / total:.0%}")
        if small[1]:
            cells.append(f"other (<5 each) {small[0]}/{small[1]} {small[0] / small[1]:.0%}")
        lines += ["", f"by {name}: " + "; ".join(cells)]
    return lines


def real_errors(classifier: Classifier, examples: Sequence[Example]) -> list[tuple[int, TaskGuess]]:
    """``(position in examples, guess)`` of every misclassified real-source (not synthetic)
    example, in order."""
    return [
        (position, guess)
        for position, example in enumerate(examples)
        if not example.source.startswith("synth")
        for guess in [classifier.classify(example.body)]
        if guess.task != example.task
    ]


def format_errors(classifier: Classifier, examples: Sequence[Example], num_errors: int) -> str:
    """``num_errors`` misclassified real-source examples, drawn at random with seed 0: the
    label, the guess, the last user turn and the start and end of the context."""
    misses = [(examples[i], guess) for i, guess in real_errors(classifier, examples)]
    random.Random(0).shuffle(misses)
    lines = [f"\n{len(misses)} real-source errors; {min(num_errors, len(misses))} of them:"]
    for number, (example, guess) in enumerate(misses[:num_errors]):
        focus, context = request_segments(example.body)
        lines.append(
            f"#{number} {example.source} label={example.task} guess={guess.task} "
            f"confidence={guess.confidence:.2f}"
        )
        lines.append(f"  request: {snippet(focus, 400)}")
        if context:
            lines.append(f"  context: {snippet(context, 200)}")
        if example.answer:
            lines.append(f"  answer:  {snippet(example.answer, 200)}")
    return "\n".join(lines)


def snippet(text: str, num_chars: int) -> str:
    """``repr`` of the text, or of its first 3/4 and last 1/4 of ``num_chars`` when longer."""
    if len(text) <= num_chars:
        return repr(text)
    return f"{text[: num_chars * 3 // 4]!r} ... {text[-(num_chars // 4) :]!r}"
