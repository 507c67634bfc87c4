"""Held-out accuracy, per-class precision/recall, confusion matrix and latency."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from controller.classifier.base import Classifier
from controller.classifier.corpus import Example
from policies.types import TASKS, Task


@dataclass
class EvalReport:
    """Counts over the held-out examples; ``confusion[(true, predicted)]``."""

    num_examples: int = 0
    num_correct: int = 0
    confusion: Counter[tuple[Task, Task]] = field(default_factory=Counter)
    per_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [correct, total]
    latencies_s: list[float] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.num_correct / self.num_examples if self.num_examples else 0.0

    def precision(self, task: Task) -> float:
        predicted = sum(self.confusion[(truth, task)] for truth in TASKS)
        return self.confusion[(task, task)] / predicted if predicted else 0.0

    def recall(self, task: Task) -> float:
        actual = sum(self.confusion[(task, guess)] for guess in TASKS)
        return self.confusion[(task, task)] / actual if actual else 0.0

    def latency_percentile_s(self, percentile: float) -> float:
        return float(np.percentile(self.latencies_s, percentile)) if self.latencies_s else 0.0


def evaluate(classifier: Classifier, examples: Sequence[Example]) -> EvalReport:
    """Classify every example once; latency is the wall time around ``classify``."""
    report = EvalReport()
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
    return report


def format_report(report: EvalReport) -> str:
    lines = [f"held-out examples: {report.num_examples}  accuracy: {report.accuracy:.2%}", ""]
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
    p50_us = report.latency_percentile_s(50) * 1e6
    p99_us = report.latency_percentile_s(99) * 1e6
    lines += ["", f"latency per request: p50 {p50_us:.1f} us  p99 {p99_us:.1f} us"]
    return "\n".join(lines)
