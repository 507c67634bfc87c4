"""How well the draft's own confidence predicts acceptance, per task and position (issue 16).

Runs the embedded engine greedy at the widest k on real prompts of every source and records,
for every verified drafted position, the draft's top-1 probability (``StepReport.
draft_confidence``) and its outcome: accepted (1), the first rejection (0); positions after the
first rejection are censored (their outcome is unknown) and dropped, as vLLM's estimator does.
Per task and position: the acceptance rate, the AUC of confidence against the outcome
(Mann-Whitney, ties count half) and a reliability table (mean confidence vs rate per bin).
This is the calibration a synthetic confidence must match (``sim`` confidence model).

    .venv/bin/python bench/draft_confidence.py --prompts .train/eval_prompts.json \\
        --out bench/results/draft_confidence_demo_cpu.json

``--prompts``: the JSON ``python -m training.prompts DATA_DIR N OUT`` writes (source -> texts);
without it, ``--shared-data`` is read directly. ``--raw FILE.jsonl.gz`` also keeps every step
whole, one JSON line each: ``{"task", "prompt", "step", "confidence": [every drafted position],
"accept_length"}`` (positions after the first rejection included: what the joint structure of
a block's confidences says, ``bench/confidence_joint.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.commands.generate import _prompt_ids  # noqa: E402
from engines.embedded import AsyncEngine, SamplingParams  # noqa: E402
from policies.types import max_spec_tokens  # noqa: E402
from training.prompts import all_sources, load_prompts, task_of  # noqa: E402

BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99, 1.0001)


def auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """P(score of a random positive > score of a random negative), ties half."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    if len(pos) == 0 or len(neg) == 0:
        return None
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    values = np.concatenate([pos, neg])[order]
    # average ranks over ties
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos_ranks = ranks[: len(pos)].sum()
    return float((pos_ranks - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def outcomes(confidence: tuple[float, ...], accept_length: int) -> list[tuple[int, float, int]]:
    """(position, confidence, label) for the uncensored positions of one step."""
    accepted = accept_length - 1
    out = [(i, c, 1) for i, c in enumerate(confidence[:accepted])]
    if accepted < len(confidence):
        out.append((accepted, confidence[accepted], 0))
    return out


def summarise(rows: list[tuple[int, float, int]], positions: int) -> dict[str, Any]:
    array = np.array(rows, dtype=np.float64).reshape(-1, 3)
    position, conf, label = array[:, 0].astype(int), array[:, 1], array[:, 2].astype(int)
    per_position = []
    for p in range(positions):
        mask = position == p
        per_position.append(
            {
                "position": p + 1,
                "observations": int(mask.sum()),
                "accept_rate": float(label[mask].mean()) if mask.any() else None,
                "mean_confidence": float(conf[mask].mean()) if mask.any() else None,
                "auc": auc(conf[mask], label[mask]),
            }
        )
    reliability = []
    for lo, hi in itertools.pairwise(BINS):
        mask = (conf >= lo) & (conf < hi)
        if mask.any():
            reliability.append(
                {
                    "bin": [lo, min(hi, 1.0)],
                    "observations": int(mask.sum()),
                    "mean_confidence": float(conf[mask].mean()),
                    "accept_rate": float(label[mask].mean()),
                }
            )
    return {
        "observations": len(label),
        "accept_rate": float(label.mean()) if len(label) else None,
        "auc_all_positions": auc(conf, label),
        "per_position": per_position,
        "reliability": reliability,
    }


async def collect(
    args: argparse.Namespace, raw: list[dict[str, Any]] | None = None
) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    engine = AsyncEngine.load(
        args.target, args.draft, device=args.device, max_batch_size=args.batch, max_seq_len=1024
    )
    engine._engine.runner.measure_confidence = True  # off by default: every step reports it
    ceiling = max_spec_tokens(engine.block_size)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    by_task: dict[str, list[Any]] = {}
    sources = all_sources()
    bar = tqdm(total=len(sources) * args.prompts_per_source, desc="prompts", unit="prompt")

    async def one(task: str, text: str, prompt: int) -> None:
        ids = _prompt_ids(engine.tokenizer, {"prompt": text})[-args.max_prompt_tokens :]
        step = 0
        async for event in engine.generate(ids, params, lambda view: ceiling):
            report = event.report
            if report is not None and report.spec_tokens > 0:
                by_task.setdefault(task, []).extend(
                    outcomes(report.draft_confidence, report.accept_length)
                )
                if raw is not None and report.draft_confidence:
                    raw.append(
                        {
                            "task": task,
                            "prompt": prompt,
                            "step": step,
                            "confidence": [round(c, 6) for c in report.draft_confidence],
                            "accept_length": report.accept_length,
                        }
                    )
                step += 1
        bar.update(1)

    counter = itertools.count()
    try:
        for source in sources:
            texts = load_prompts(source, args.shared_data, args.prompts_per_source, args.prompts)
            await asyncio.gather(*(one(task_of(source), t, next(counter)) for t in texts))
    finally:
        bar.close()
        await engine.close()
    return by_task, {"block_size": engine.block_size, "spec_tokens": ceiling}


def _fmt(value: float | None, digits: int) -> str:
    """A figure, or "-" where too few observations gave none."""
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=ROOT / "models" / "demo" / "target")
    parser.add_argument("--draft", type=Path, default=ROOT / "models" / "demo" / "draft")
    parser.add_argument("--prompts", type=Path, default=None, help="training.prompts JSON")
    parser.add_argument("--shared-data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--prompts-per-source", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8, help="engine max batch size")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--raw", type=Path, default=None, help="also write every step whole (.jsonl.gz)"
    )
    args = parser.parse_args()
    started = time.time()
    raw: list[dict[str, Any]] | None = [] if args.raw else None
    by_task, shape = asyncio.run(collect(args, raw))
    if args.raw and raw is not None:
        with gzip.open(args.raw, "wt") as f:
            for line in raw:
                f.write(json.dumps(line) + "\n")
    positions = shape["spec_tokens"]
    every = [row for rows in by_task.values() for row in rows]
    result = {
        "command": " ".join(["python", *sys.argv]),
        "machine": f"{platform.node()} {platform.machine()} ({args.device})",
        "pair": {"target": str(args.target), "draft": str(args.draft), **shape},
        "prompts_per_source": args.prompts_per_source,
        "max_new_tokens": args.max_new_tokens,
        "wall_s": round(time.time() - started, 1),
        "all": summarise(every, positions),
        "tasks": {task: summarise(rows, positions) for task, rows in sorted(by_task.items())},
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    for task, summary in [("all", result["all"]), *result["tasks"].items()]:
        aucs = [p["auc"] for p in summary["per_position"]]
        print(
            f"{task:>5}: n={summary['observations']} accept={_fmt(summary['accept_rate'], 3)} "
            f"AUC(all)={_fmt(summary['auc_all_positions'], 3)} per position: "
            + " ".join(_fmt(a, 2) for a in aucs)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
