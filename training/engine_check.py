"""Re-measure the pair through draftctl's embedded engine (`draftctl generate --json`).

Runs the held-out prompts at k = block_size - 1 and at k = 0 (no drafting), checks that greedy
outputs are token-identical (speculation is lossless), and compares per-request accept lengths
with the dflash reference traces of `python -m training eval`. Writes
bench/results/pair_<name>_embedded.json and traces/<name>_b<B>_embedded.jsonl.

    .venv/bin/python -m training.engine_check --pair models/demo \
        --reference-traces traces/demo_b8.jsonl --prompts-file .train/eval_prompts.json
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from training.prompts import all_sources, task_of


def generate(args, jsonl: Path, spec_tokens: int | None) -> list[dict]:
    argv = [sys.executable, "-m", "controller.cli", "--log-level", "warning", "generate",
            "--target", str(args.pair / "target"), "--draft", str(args.pair / "draft"),
            "--jsonl", str(jsonl), "--json", "--device", "cpu",
            "--max-new-tokens", str(args.max_new_tokens),
            "--max-batch-size", str(args.max_batch_size)]  # fmt: skip
    if spec_tokens is not None:
        argv += ["--spec-tokens", str(spec_tokens)]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", type=Path, default=Path("models/demo"))
    parser.add_argument("--prompts-file", type=Path, required=True)
    parser.add_argument("--prompts-per-task", type=int, default=20)
    parser.add_argument("--reference-traces", type=Path, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    block_size = json.loads((args.pair / "draft" / "config.json").read_text())["dflash_config"][
        "block_size"
    ]
    prompts = json.loads(args.prompts_file.read_text())
    items = [(s, p) for s in all_sources() for p in prompts[s][: args.prompts_per_task]]
    jsonl = Path(".train") / "engine_check_prompts.jsonl"
    jsonl.parent.mkdir(exist_ok=True)
    jsonl.write_text("".join(json.dumps({"prompt": p}) + "\n" for _, p in items))
    started = time.perf_counter()
    spec = generate(args, jsonl, None)
    spec_s = time.perf_counter() - started
    plain = generate(args, jsonl, 0)
    plain_s = time.perf_counter() - started - spec_s
    reference = _reference(args.reference_traces)
    result = _report(args, block_size, items, spec, plain, reference, spec_s, plain_s)
    name = args.pair.name
    out = args.out or Path("bench/results") / f"pair_{name}_embedded.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    traces = Path("traces") / f"{name}_b{block_size}_embedded.jsonl"
    traces.write_text(
        "".join(_trace(s, block_size, r) for (s, _), r in zip(items, spec, strict=True))
    )
    print(json.dumps({k: v for k, v in result.items() if k != "requests"}, indent=2))
    return 0


def _trace(source: str, block_size: int, result: dict) -> str:
    row = {"task": task_of(source), "source": source, "block_size": block_size,
           "accept_lengths": result["accept_lengths"]}  # fmt: skip
    return json.dumps(row) + "\n"


def _reference(path: Path | None) -> dict[str, list[list[int]]]:
    by_source: dict[str, list[list[int]]] = {}
    if path is not None:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            by_source.setdefault(row["source"], []).append(row["accept_lengths"])
    return by_source


def _report(args, block_size, items, spec, plain, reference, spec_s, plain_s) -> dict:
    per_source: dict[str, dict] = {}
    rows: list[dict] = []
    seen: dict[str, int] = {}
    for (source, _), s, p in zip(items, spec, plain, strict=True):
        index = seen[source] = seen.get(source, -1) + 1
        ref = reference.get(source, [])
        ref_accept = ref[index] if index < len(ref) else None
        same = ref_accept == s["accept_lengths"] if ref_accept else None
        rows.append({"source": source, "identical": s["token_ids"] == p["token_ids"],
                     "engine_accept_lengths": s["accept_lengths"],
                     "reference_accept_lengths": ref_accept,
                     "same_accept_lengths": same})  # fmt: skip
    for source in all_sources():
        mine = [r for r in rows if r["source"] == source]
        steps = [a for r in mine for a in r["engine_accept_lengths"]]
        ref_steps = [a for r in mine for a in (r["reference_accept_lengths"] or [])]
        per_source[source] = {
            "num_prompts": len(mine),
            "mean_accept_length": round(statistics.fmean(steps), 3) if steps else None,
            "reference_mean_accept_length": round(statistics.fmean(ref_steps), 3)
            if ref_steps
            else None,
            "identical_outputs": sum(r["identical"] for r in mine),
            "same_accept_lengths_as_reference": sum(bool(r["same_accept_lengths"]) for r in mine),
        }
    return {
        "pair": str(args.pair), "engine": "draftctl generate (embedded engine), CPU",
        "block_size": block_size, "spec_tokens": block_size - 1, "decoding": "greedy",
        "max_new_tokens": args.max_new_tokens, "max_batch_size": args.max_batch_size,
        "wall_s_spec": round(spec_s, 1), "wall_s_no_spec": round(plain_s, 1),
        "per_source": per_source, "requests": rows,
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
