"""Ragged steps on the CPU: packed (each row computes its own k + 1 tokens) vs padded (every row
computes the widest row's width), on the committed demo pair through the embedded engine.

A batch of 8 requests; each request's k comes from a fixed pattern (e.g. "0,7": rows 0, 2, ...
draft nothing, rows 1, 3, ... draft 7 — what a policy that turns drafting off for chat does in
a mixed batch). Both modes emit identical tokens (checked); the figure is wall time per step
and tokens per second. Rounds alternate the modes; the median is reported.

    .venv/bin/python bench/packed_cpu.py [--pattern 0,7] [--rounds 3] [--new-tokens 96] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams
from engines.embedded.loader import load_runner
from engines.embedded.request import Request

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"
PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then half as many in May. "
    "How many clips did she sell altogether?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What are some good ways to spend a rainy weekend at home?",
    "A train travels 60 miles per hour for 3 hours. How far does it go?",
    "Write a function to check whether a string is a palindrome.",
    "Tell me about the history of the printing press.",
    "If 3x + 5 = 20, what is x?",
    "How do I politely decline a meeting invitation?",
]


def fixed_k(k: int) -> Any:
    return lambda view: k


def run(engine: Engine, prompts: list[list[int]], pattern: list[int], new_tokens: int) -> dict:
    requests = [
        Request(
            f"r{i}",
            ids,
            SamplingParams(max_new_tokens=new_tokens),
            fixed_k(pattern[i % len(pattern)]),
            {},
        )
        for i, ids in enumerate(prompts)
    ]
    for request in requests:
        engine.add(request)
    engine.step()  # prefills (not timed)
    steps, started = 0, time.perf_counter()
    while engine.has_work:
        engine.step()
        steps += 1
    elapsed = time.perf_counter() - started
    tokens = sum(len(r.output_ids) - 1 for r in requests)
    return {
        "ms_per_step": 1e3 * elapsed / steps,
        "tokens_per_s": tokens / elapsed,
        "steps": steps,
        "outputs": [r.output_ids for r in requests],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pattern", default="0,7", help="k per request, repeated over the batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO / "target"), local_files_only=True)
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for p in PROMPTS
    ]
    pattern = [int(k) for k in args.pattern.split(",")]
    runner = load_runner(DEMO / "target", DEMO / "draft", torch.device("cpu"), 8, 512)
    engine = Engine(runner, 8, 512)
    results: dict[str, list[dict[str, Any]]] = {"packed": [], "padded": []}
    run(engine, prompts, pattern, 8)  # warm-up
    for _ in range(args.rounds):
        for mode in ("packed", "padded"):
            runner.pack_ragged = mode == "packed"
            results[mode].append(run(engine, prompts, pattern, args.new_tokens))
    same = all(a["outputs"] == b["outputs"] for a, b in zip(*results.values(), strict=True))
    report: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "pattern": pattern,
        "batch": len(prompts),
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "identical_outputs": same,
    }
    for mode, runs in results.items():
        report[mode] = {
            key: statistics.median(r[key] for r in runs) for key in ("ms_per_step", "tokens_per_s")
        }
    report["speedup"] = report["packed"]["tokens_per_s"] / report["padded"]["tokens_per_s"]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for mode in results:
            print(
                f"{mode}: {report[mode]['ms_per_step']:.1f} ms/step, "
                f"{report[mode]['tokens_per_s']:.0f} tok/s"
            )
        print(f"packed / padded: {report['speedup']:.2f}x (identical outputs: {same})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
