"""Does the goodput policy learn its task acceptance from steps it chose because they looked
easy? The accept lengths its online estimates were fed, against what a static k realizes on
the same requests.

One harness call (``bench/gpu_decisions.py``, the ``real-pair`` arm: a trained pair on real
prompts, so acceptance varies from request to request and stretch to stretch) with two
policies, ``goodput`` and ``static-k<K>`` (K the block's widest k). Every drafted row-step
goodput recorded into its task estimates (``OnlineModels.record_steps``, its warm pass
included) is collected; at k = K it is compared with what static-k<K> realized, which drafts
every step of every request and so selects nothing. Goodput decides a row's k from the task
estimate blended with that row's own recent steps (and, in two-phase steps, from the draft's
confidence), so the steps it drafts lean towards easy ones; if its k = K steps accept more
than static-k<K>'s, its task estimate is biased upwards for a row it has not seen yet.

    .venv/bin/python bench/selection_bias.py --prompts PROMPTS.jsonl --out bench/results/X.json

PROMPTS.jsonl: ``{"task", "prompt"}`` lines (``bench/h200_goodput_run.sh`` step 3 makes them
from ``.train/eval_prompts.json``). Default pair: the repository's demo pair on this machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL of {task, prompt}")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--target", type=Path, default=ROOT / "models/demo/target")
    parser.add_argument("--draft", type=Path, default=ROOT / "models/demo/draft")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--scale", type=float, default=0.1, help="the harness's --scale")
    parser.add_argument("--phases", default=None, help="the harness's --phases (default its own)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.prompts.is_file():
        parser.error(f"--prompts {args.prompts}: no such file")
    if args.scale <= 0:
        parser.error("--scale must be positive")
    return args


def summarise(lengths: Sequence[int]) -> dict[str, float]:
    """Row-steps, mean accept length (bonus token included), and the share that accepted the
    first drafted position."""
    return {
        "row_steps": len(lengths),
        "mean_accept": round(statistics.fmean(lengths), 4),
        "first_position_accepted": round(sum(n >= 2 for n in lengths) / len(lengths), 4),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench.gpu_decisions import main as harness
    from policies.online import OnlineModels

    fed: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    original = OnlineModels.record_steps

    def record_steps(self: OnlineModels, task: Any, ks: Sequence[int], ns: Sequence[int]) -> None:
        for k, n in zip(ks, ns, strict=True):
            if k > 0:
                fed[str(task.value)][int(k)].append(int(n))
        original(self, task, ks, ns)

    config = json.loads((args.draft / "config.json").read_text())
    block = int(config.get("block_size") or config.get("dflash_config", {}).get("block_size", 16))
    widest = block - 1
    static = f"static-k{widest}"
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "harness.json"
        call = [
            "--arm", "real-pair", "--target", str(args.target), "--draft", str(args.draft),
            "--prompts", str(args.prompts), "--device", args.device, "--verify-mode", "ragged",
            "--scale", str(args.scale), "--repeats", "1", "--policies", f"goodput,{static}",
            "--exactness-prompts", "0", "--warm-policies", "--seed", str(args.seed),
            "--out", str(raw),
        ]  # fmt: skip
        if args.device == "cpu":
            call += ["--cost-table", "engine"]
        if args.phases:
            call += ["--phases", args.phases]
        OnlineModels.record_steps = record_steps  # type: ignore[method-assign]
        try:
            code = harness(call)
        finally:
            OnlineModels.record_steps = original  # type: ignore[method-assign]
        if code:
            return code
        report = json.loads(raw.read_text())
    runs = {run["policy"]: run for run in report["runs"]}
    realized: dict[str, dict[str, float]] = {}
    for phase, cell in runs[static]["phases"].items():
        for task, mean in cell["accept_length_by_task"].items():
            realized.setdefault(task, {})[phase] = round(mean, 4)
    tasks = {}
    for task, by_k in sorted(fed.items()):
        at_widest = by_k.get(widest, [])
        tasks[task] = {
            "goodput_fed_at_k": summarise(at_widest) if at_widest else None,
            "goodput_fed_other_k": {str(k): len(v) for k, v in sorted(by_k.items()) if k != widest},
            "static_realized_by_phase": realized.get(task, {}),
        }
    document = {
        "command": " ".join(["bench/selection_bias.py", *(argv or sys.argv[1:])]),
        "machine": platform.node(),
        "pair": {"target": str(args.target), "draft": str(args.draft), "block_size": block},
        "k": widest,
        "harness": report["command"],
        "tasks": tasks,
        "tok_s": {name: round(run["tok_s"], 1) for name, run in runs.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps(tasks, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
