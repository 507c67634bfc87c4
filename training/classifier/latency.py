"""Classification latency measured in a lean process, as the daemon would see it.

``draftctl classifier eval`` holds the whole labelled corpus (~1 GB of Python objects) while
it scores accuracy. In that heap, glibc's allocator makes every ``classify`` call slower
(GSM8K requests: p50 91 us there, 51 us with ``MALLOC_MMAP_THRESHOLD_=4000000``, 50 us in a
fresh process), which the daemon, which never loads the corpus, does not pay. So ``eval``
writes the held-out requests to a temporary JSONL file and times them in a child process:

    python -m training.classifier.latency REQUESTS.jsonl [--artifact DIR]

It prints the p50/p99 of ``classify`` over the requests (after a warm-up, with start-up
objects frozen out of the cyclic GC as ``controller/server.py`` does) and over
``max_chars``-character prompts made by joining the requests' texts.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from controller.classifier.artifact import load_classifier
from controller.classifier.base import Classifier
from controller.classifier.text import request_text
from training.classifier.evaluation import format_latency, long_prompt_latencies_s

NUM_WARM_UP = 200  # classify calls before timing (numpy's first calls are slower)


def request_latencies_s(classifier: Classifier, bodies: Sequence[Mapping[str, Any]]) -> list[float]:
    """Wall time of ``classify`` around each request, one call at a time."""
    latencies_s = []
    for body in bodies:
        start_s = time.perf_counter()
        classifier.classify(body)
        latencies_s.append(time.perf_counter() - start_s)
    return latencies_s


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="classify latency in a lean process")
    parser.add_argument("requests", type=Path, help="JSONL file, one request body a line")
    parser.add_argument("--artifact", type=Path, default=None)
    args = parser.parse_args(argv)
    classifier = load_classifier(args.artifact)
    with args.requests.open(encoding="utf-8") as lines:
        bodies = [json.loads(line) for line in lines if line.strip()]
    texts = [request_text(body, classifier.max_chars) for body in bodies]
    gc.collect()
    gc.freeze()
    request_latencies_s(classifier, bodies[:NUM_WARM_UP])
    latencies_s = request_latencies_s(classifier, bodies)
    print(format_latency("latency per held-out request", latencies_s))
    num_chars = classifier.max_chars
    long_s = long_prompt_latencies_s(classifier, texts, num_chars)
    print(format_latency(f"latency per {num_chars}-character prompt", long_s))


if __name__ == "__main__":
    main()
