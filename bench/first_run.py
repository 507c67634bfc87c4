"""Issue #19's check: on this machine, does the default policy choose, per task, the k that
measures fastest here?

1. Fixed k with ``draftctl generate`` (``--spec-tokens K --max-batch-size 1``, no daemon): every
   task's prompts at each k in {0, 4, block - 1}, the (task, k) runs in random order, repeated;
   decode tok/s = tokens after the first / time after the first token, summed over prompts.
2. In one ``draftctl serve`` with the repository's config.yaml and default policy: blocks in
   random order, repeated — the default (a learning round over every prompt, then a measured
   round) and each fixed k (a static policy with that k everywhere, put through the admin API,
   one measured round). Prompts go one at a time, streamed, in a shuffled mixed order with no
   task hint (the classifier decides); decode tok/s from the first to the last content chunk.

The verdict per task: the default's decode tok/s against the fastest fixed k in the same
daemon, the k the default ran, why (the step planner's reason), and the fastest k by
``draftctl generate``.

    .venv/bin/python bench/first_run.py --out bench/results/first_run_cpu_2026-12-01.json

Prompts come from ../shared/data (GSM8K test, MBPP test split, MT-Bench first turns of the
writing, roleplay, humanities and stem categories).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared-data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--prompts-per-task", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2, help="repeats of every block")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="the default's rounds per block (all but the last learn)",
    )
    parser.add_argument(
        "--generate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time each fixed k with `draftctl generate` (single stream, no daemon)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def prompts(shared: Path, per_task: int) -> dict[str, list[str]]:
    def jsonl(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    mbpp = [t for t in jsonl(shared / "mbpp" / "mbpp.jsonl") if 11 <= t["task_id"] <= 510]
    chat = [
        q
        for q in jsonl(shared / "mt_bench" / "question.jsonl")
        if q.get("category") in ("writing", "roleplay", "humanities", "stem")
    ]
    return {
        "math": [q["question"] for q in jsonl(shared / "gsm8k" / "test.jsonl")[:per_task]],
        "code": [t["text"] for t in mbpp[:per_task]],
        "chat": [q["turns"][0] for q in chat[:per_task]],
    }


def fixed_k(
    by_task: dict[str, list[str]], ks: list[int], args: argparse.Namespace, folder: Path
) -> dict[str, Any]:
    runs = [(task, k, r) for task in by_task for k in ks for r in range(args.repeats)]
    random.Random(args.seed).shuffle(runs)
    results: dict[str, dict[str, list[float]]] = {t: {str(k): [] for k in ks} for t in by_task}
    for number, (task, k, _) in enumerate(runs, start=1):
        source = folder / f"{task}.jsonl"
        source.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in by_task[task]))
        command = [
            sys.executable,
            "-m",
            "controller.cli",
            "generate",
            "--target",
            str(DEMO / "target"),
            "--draft",
            str(DEMO / "draft"),
            "--jsonl",
            str(source),
            "--spec-tokens",
            str(k),
            "--device",
            "cpu",
            "--max-batch-size",
            "1",
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--json",
        ]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        tokens = sum(len(r["token_ids"]) - 1 for r in rows)
        seconds = sum(
            (len(r["token_ids"]) - 1) / r["decode_tokens_per_s"]
            for r in rows
            if r["decode_tokens_per_s"]
        )
        results[task][str(k)].append(tokens / seconds)
        print(
            f"[{number}/{len(runs)}] fixed k={k:2d} {task:5s} {tokens / seconds:7.1f} tok/s",
            flush=True,
        )
    summary: dict[str, Any] = {}
    for task, cells in results.items():
        means = {k: statistics.fmean(v) for k, v in cells.items()}
        best = max(means, key=lambda k: means[k])
        summary[task] = {
            "tok_s": {k: {"mean": means[k], "runs": v} for k, v in cells.items()},
            "best_k": int(best),
        }
    return summary


def start_daemon(folder: Path) -> tuple[subprocess.Popen[str], str]:
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["server"]["port"] = 0
    config["policy"] = {
        "path": str(folder / "policy.yaml"),
        "versions_dir": str(folder / "versions"),
    }
    for backend in config["backends"]:
        for key in ("target", "draft"):
            backend[key] = str(ROOT / backend[key])
        backend["device"] = "cpu"
        backend["cost_cache_dir"] = str(folder / "cost-tables")  # measured afresh
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "controller.cli", "serve", "--config", str(path)]
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert proc.stderr is not None
    lines = []
    while True:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("draftctl serve exited:\n" + "".join(lines))
        lines.append(line)
        print("  serve:", line.rstrip(), flush=True)
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, found.group(1)


def static_policy(k: int) -> str:
    """Every task at ``k`` in every band (k = 0: drafting off)."""
    row = f"[{k}, {k}, {k}, {k}]"
    return (
        f"kind: static\nmin_spec_tokens: {min(4, k) if k else 4}\nstatic:\n"
        f"  concurrency_bands: [8, 32, 64]\n  spec_tokens:\n"
        f"    math: {row}\n    code: {row}\n    chat: {row}\n"
    )


async def one_round(
    session: aiohttp.ClientSession, base: str, order: list[tuple[str, str]], max_tokens: int
) -> list[dict[str, Any]]:
    """Every prompt once, one at a time, streamed; decode time = first to last chunk."""
    out = []
    for task, prompt in order:
        body = {
            "model": "demo",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        first = last = None
        info: dict[str, Any] = {}
        tokens = 0
        async with session.post(base + "/v1/chat/completions", json=body) as r:
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                now = time.perf_counter()
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    first = first or now
                    last = now
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                info = chunk.get("draftctl", info)
        out.append(
            {
                "labelled": task,
                "classified": info.get("task"),
                "tokens": tokens,
                "decode_s": (last - first) if first and last else None,
                "accept_length": info.get("accept_length"),
            }
        )
    return out


def decode_tok_s(rows: list[dict[str, Any]], task: str) -> float | None:
    mine = [r for r in rows if r["labelled"] == task and r["decode_s"]]
    seconds = sum(r["decode_s"] for r in mine)
    return sum(r["tokens"] - 1 for r in mine) / seconds if seconds else None


async def in_daemon(
    base: str, by_task: dict[str, list[str]], ks: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """Blocks in random order, repeated: the default policy (a learning round of every prompt,
    then a measured one) and each fixed k (a static policy, one measured round); policies are
    switched through the admin API, so all run in the same daemon on the same path."""
    order = [(task, p) for task, items in by_task.items() for p in items]
    blocks = ["default", *(f"k{k}" for k in ks)]
    results: dict[str, list[dict[str, Any]]] = {b: [] for b in blocks}
    stats_after_default: list[Any] = []
    async with aiohttp.ClientSession() as session:
        async with session.get(base + "/admin/policy") as r:
            default_text = await r.text()
        rng = random.Random(args.seed)
        for repeat in range(args.repeats):
            for block in rng.sample(blocks, len(blocks)):
                text = default_text if block == "default" else static_policy(int(block[1:]))
                async with session.put(base + "/admin/policy", data=text) as r:
                    assert r.status == 200, await r.text()
                rounds = args.rounds if block == "default" else 1
                for round_ in range(rounds):
                    rng.shuffle(order)
                    rows = await one_round(session, base, order, args.max_new_tokens)
                    if round_ == rounds - 1:  # the default's earlier rounds are its learning
                        results[block].append({"repeat": repeat, "rows": rows})
                if block == "default":
                    async with session.get(base + "/api/stats") as r:
                        stats_after_default.append(await r.json())
                print(
                    f"  repeat {repeat} {block}: "
                    + "  ".join(f"{t} {decode_tok_s(rows, t) or 0:.1f}" for t in by_task),
                    flush=True,
                )
    summary: dict[str, Any] = {}
    for task in by_task:
        cells = {
            b: [decode_tok_s(run["rows"], task) for run in runs] for b, runs in results.items()
        }
        means = {b: statistics.fmean([v for v in vals if v]) for b, vals in cells.items()}
        fixed = {b: m for b, m in means.items() if b != "default"}
        best = max(fixed, key=lambda b: fixed[b])
        summary[task] = {
            "decode_tok_s": {b: {"mean": means[b], "runs": cells[b]} for b in blocks},
            "best_fixed": best,
            "default_vs_best_fixed": means["default"] / fixed[best],
        }
    return {"summary": summary, "runs": results, "stats_after_default": stats_after_default}


def main() -> int:
    args = parse_args()
    by_task = prompts(args.shared_data, args.prompts_per_task)
    ks = [0, 4, 7]  # the demo draft's block is 8
    started = time.time()
    with tempfile.TemporaryDirectory() as folder:
        fixed = fixed_k(by_task, ks, args, Path(folder)) if args.generate else None
        proc, base = start_daemon(Path(folder))
        try:
            daemon = asyncio.run(in_daemon(base, by_task, ks, args))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        profiles = [
            json.loads(p.read_text()) for p in (Path(folder) / "cost-tables").glob("*.json")
        ]
    verdict = {}
    last_stats = daemon["stats_after_default"][-1]
    for task in by_task:
        data = last_stats["tasks"][task]
        recent = [k for _, k in data["k_history"][-args.prompts_per_task :]]
        cell = daemon["summary"][task]
        verdict[task] = {
            "default_mean_k_measured_round": statistics.fmean(recent) if recent else None,
            "best_fixed_in_daemon": cell["best_fixed"],
            "default_vs_best_fixed": cell["default_vs_best_fixed"],
            "fastest_fixed_k_generate": None if fixed is None else fixed[task]["best_k"],
            "reason": data["k_reason"],
            "speedup_card": data["speedup"],
        }
        print(
            f"{task}: default {cell['decode_tok_s']['default']['mean']:.1f} tok/s at mean k "
            f"{verdict[task]['default_mean_k_measured_round']}, best fixed "
            f"{cell['best_fixed']} {cell['decode_tok_s'][cell['best_fixed']]['mean']:.1f} "
            f"({cell['default_vs_best_fixed']:.3f}x); {data['k_reason']}",
            flush=True,
        )
    document = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_avg_at_start": os.getloadavg(),
        },
        "duration_s": round(time.time() - started, 1),
        "prompts_per_task": args.prompts_per_task,
        "max_new_tokens": args.max_new_tokens,
        "fixed_k_generate": fixed,
        "start_up_cost_profile": profiles,
        "in_daemon": daemon,
        "verdict": verdict,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
