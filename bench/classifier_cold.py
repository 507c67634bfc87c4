"""Warm and cold ``classify`` latency of the native and numpy scorers (docs/classifier.md).

A VM vCPU that halts while the process sleeps loses its caches and branch state, so the first
``classify`` after a pause costs several times a warm one. This times, in one process and
interleaved (native, numpy, numpy, native, ...), ``classify(body)`` for the bench prompt
("Write a short poem about the sea." as one user message) and for 4,000-character prompts:

- warm: back-to-back calls (blocks of 200 per scorer) after 200 warm-up calls;
- cold: each call after ``time.sleep`` of 1.26 s, and of 20 ms.

Then it runs the lean child that ``draftctl classifier eval`` runs
(``python -m training.classifier.latency FILE``) once per scorer on the held-out requests
(``load_dataset`` of ../shared/data and the data packages, as ``eval``), and, with
``--instructions`` and valgrind installed, counts the instructions of one ``classify`` call
(callgrind; machine-independent). Every section records the 1-minute load average before
and after it, and first waits (up to 2 min) for a load below ``--max-load``.

    .venv/bin/python bench/classifier_cold.py [--cold-samples 30] [--instructions] [--out F]
    .venv/bin/python bench/classifier_cold.py --only-instructions [--out F]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.classifier import load_classifier  # noqa: E402
from controller.classifier.model import NATIVE_ENV, LinearClassifier  # noqa: E402

SHARED_DATA = ROOT.parent / "shared" / "data"
BENCH_BODY = {"messages": [{"role": "user", "content": "Write a short poem about the sea."}]}
SCORERS = ("native", "numpy")
CODE = (
    "import json\n\n\nclass Store:\n    def __init__(self, path):\n        self.path = path\n\n"
    "    def load(self):\n        with open(self.path) as handle:\n"
    "            return json.load(handle)\n\n"
)
PROSE = (
    "The harbour was quiet at dawn. Fishing boats rocked against the pier while gulls "
    "argued over scraps, and the smell of salt and diesel hung in the cold air. "
)
MATH = "Let x be a real number such that 3x^2 - 5x + 2 = 0. Find the sum of all such x. "


def long_bodies(num_chars: int) -> list[dict[str, Any]]:
    """Three ``num_chars``-character single-turn prompts: code, prose and maths."""
    return [
        {
            "messages": [
                {"role": "user", "content": (text * (num_chars // len(text) + 1))[:num_chars]}
            ]
        }
        for text in (CODE, PROSE, MATH)
    ]


def classifiers() -> dict[str, LinearClassifier]:
    builtin = load_classifier(None)
    bias = builtin.bias.astype(np.float32)
    return {
        scorer: LinearClassifier(
            builtin.spec, builtin.tasks, builtin.weights, bias, builtin.max_chars,
            builtin.combiner, scorer=scorer,
        )
        for scorer in SCORERS
    }  # fmt: skip


def wait_for_quiet(max_load: float, timeout_s: float = 120.0) -> float:
    deadline = time.monotonic() + timeout_s
    while os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(5.0)
    return round(os.getloadavg()[0], 2)


def percentiles_us(samples_s: list[float]) -> dict[str, Any]:
    p50, p99 = np.percentile(samples_s, [50, 99]) * 1e6
    figures: dict[str, Any] = {"p50_us": round(float(p50), 1), "p99_us": round(float(p99), 1)}
    figures["n"] = len(samples_s)
    if len(samples_s) <= 100:  # few samples: show them all, in order
        figures["samples_us"] = [round(sample * 1e6) for sample in samples_s]
    return figures


def time_call(call: Callable[[], Any]) -> float:
    start_s = time.perf_counter()
    call()
    return time.perf_counter() - start_s


def interleaved(
    calls: Mapping[str, Callable[[], Any]], num_samples: int, sleep_s: float, block: int = 1
) -> dict[str, dict[str, Any]]:
    """``num_samples`` timed calls of each, in blocks of ``block`` calls, alternating which
    goes first; sleep before each call."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for index in range(num_samples // block):
        for name in names if index % 2 == 0 else names[::-1]:
            for _ in range(block):
                if sleep_s:
                    time.sleep(sleep_s)
                samples[name].append(time_call(calls[name]))
    return {name: percentiles_us(values) for name, values in samples.items()}


def latency_section(
    models: dict[str, LinearClassifier], bodies: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    counter = {"index": 0}

    def caller(model: LinearClassifier) -> Callable[[], Any]:
        def call() -> Any:
            counter["index"] += 1
            return model.classify(bodies[counter["index"] % len(bodies)])

        return call

    calls = {scorer: caller(model) for scorer, model in models.items()}
    for _ in range(200):
        for call in calls.values():
            call()
    result: dict[str, Any] = {}
    # Warm: blocks of 200 back-to-back calls per scorer, so neither evicts the other's code.
    modes = [("warm", 2000, 0.0, 200), ("cold_20ms", args.cold_samples * 4, 0.02, 1)]
    modes.append(("cold_1.26s", args.cold_samples, 1.26, 1))
    for mode, num_samples, sleep_s, block in modes:
        load_before = wait_for_quiet(args.max_load)
        figures = interleaved(calls, num_samples, sleep_s, block)
        result[mode] = {**figures, "load_1min": [load_before, round(os.getloadavg()[0], 2)]}
        print(json.dumps({mode: result[mode]}), file=sys.stderr, flush=True)
    return result


def held_out_file(folder: Path) -> tuple[Path, int] | None:
    """The held-out requests as JSONL, as `classifier eval` writes them (all sources)."""
    if not SHARED_DATA.is_dir():
        return None
    from training.classifier.dataset import load_dataset

    dataset = load_dataset(SHARED_DATA)
    path = folder / "held_out.jsonl"
    rows = dataset.subset(is_test=True)
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(dataset.examples[row].body) + "\n")
    return path, len(rows)


def child_latency(requests: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`python -m training.classifier.latency FILE` with each scorer (NATIVE_ENV=1 / 0)."""
    result: dict[str, Any] = {}
    command = [sys.executable, "-m", "training.classifier.latency", str(requests)]
    for scorer in SCORERS:
        env = {**os.environ, NATIVE_ENV: "1" if scorer == "native" else "0"}
        load_before = wait_for_quiet(args.max_load)
        run = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        result[scorer] = {
            "output": run.stdout.strip().splitlines(),
            "load_1min": [load_before, round(os.getloadavg()[0], 2)],
        }
        print(json.dumps({f"child_{scorer}": result[scorer]}), file=sys.stderr, flush=True)
    return {"command": " ".join(["python", *command[1:3], "FILE"]), **result}


INSTRUCTION_CHILD = """
import gc, sys
from controller.classifier import load_classifier
classifier = load_classifier(None)
gc.collect()
gc.freeze()
body = {"messages": [{"role": "user", "content": sys.argv[2]}]}
for _ in range(int(sys.argv[1])):
    classifier.classify(body)
"""


def instructions_per_call(text: str, scorer: str, num_calls: int = 1000) -> int:
    """callgrind totals of a child making 50 vs 50 + ``num_calls`` calls, per call (a fixed
    hash seed: string hashing otherwise moves the count between runs)."""
    totals = []
    env = {**os.environ, NATIVE_ENV: "1" if scorer == "native" else "0", "PYTHONHASHSEED": "0"}
    env["OPENBLAS_NUM_THREADS"] = "1"  # idle BLAS threads spin: instructions not ours
    with tempfile.TemporaryDirectory() as folder:
        for count in (50, 50 + num_calls):
            out = Path(folder) / f"cg.{count}"
            command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
            command += [sys.executable, "-c", INSTRUCTION_CHILD, str(count), text]
            subprocess.run(command, env=env, cwd=ROOT, capture_output=True, check=True)
            line = next(x for x in out.read_text().splitlines() if x.startswith("totals:"))
            totals.append(int(line.split()[1]))
    return round((totals[1] - totals[0]) / num_calls)


def instruction_section() -> dict[str, Any]:
    texts = {"bench_prompt": "Write a short poem about the sea.", "4000_chars": (PROSE * 40)[:4000]}
    return {
        name: {scorer: instructions_per_call(text, scorer) for scorer in SCORERS}
        for name, text in texts.items()
    }


def timings(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {}
    models = classifiers()
    gc.collect()
    gc.freeze()  # as the daemon does after start-up (controller/server.py)
    report["bench_prompt"] = latency_section(models, [BENCH_BODY], args)
    report["4000_chars"] = latency_section(models, long_bodies(4000), args)
    with tempfile.TemporaryDirectory() as folder:
        held_out = held_out_file(Path(folder))
        if held_out is not None:
            report["eval_child"] = {"num_requests": held_out[1]}
            report["eval_child"].update(child_latency(held_out[0], args))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cold-samples", type=int, default=30, help="calls per 1.26 s mode")
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--instructions", action="store_true", help="callgrind (valgrind)")
    parser.add_argument("--only-instructions", action="store_true", help="skip the timings")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    report: dict[str, Any] = {
        "command": "bench/classifier_cold.py " + " ".join(sys.argv[1:]),
        "commit": commit,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, {os.uname().release}",
    }
    if not args.only_instructions:
        report.update(timings(args))
    if args.instructions or args.only_instructions:
        report["instructions_per_classify"] = instruction_section()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
