"""Static k vs goodput on the real embedded engine: wall-clock tokens/s over a shifting load.

One run loads the engine once, warms it up, then replays the same closed-loop request
sequence (phases of concurrency and task mix, like scenarios/mixed-shift.yaml) under each
policy: no-spec, static-k<N> for each --static value, and goodput (the real GoodputPolicy fed by
OnlineModels, asked per request per step through the engine's spec_controller). Prints a
table and one JSON object (also written to --out).

    python bench/goodput_gpu.py --target DIR --draft DIR \
        --cost-table cost_tables/qwen3-8b-h200.json --out "$OUT/goodput_gpu.json"

Phases: "CONCURRENCY:SECONDS:task=share,...;..." (default 1 -> 32 -> 8 clients, math-heavy ->
mixed -> chat-heavy, 40 s each). Prompts: --prompts FILE.jsonl with {"task", "prompt"} lines,
else a small built-in set (varied by index) so that the script needs nothing outside the repo.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec
from policies.online import OnlineModels
from policies.step_controller import StepController
from policies.types import Task

DEFAULT_PHASES = (
    "1:40:math=0.8,code=0.1,chat=0.1;"
    "32:40:math=0.4,code=0.2,chat=0.4;"
    "8:40:math=0.1,code=0.1,chat=0.8"
)
BUILTIN_PROMPTS = {
    Task.MATH: [
        "Solve step by step: a train travels {n} km in 3 hours. What is its speed in m/s?",
        "Compute the sum of all integers from 1 to {n}, showing your reasoning.",
        "If 3x + {n} = 2x - 7, find x and verify the answer.",
    ],
    Task.CODE: [
        "Write a Python function that returns the {n}th Fibonacci number iteratively.",
        "Implement binary search in Python over a sorted list of {n} integers, with tests.",
        "Write a Python class for an LRU cache holding at most {n} items.",
    ],
    Task.CHAT: [
        "Tell me about a memorable trip to a city with {n} bridges.",
        "What are some tips for staying focused when working from home {n} days a week?",
        "Write a short friendly note inviting {n} colleagues to a team lunch.",
    ],
}


@dataclass(frozen=True)
class Phase:
    concurrency: int
    duration_s: float
    mix: dict[Task, float]

    @property
    def name(self) -> str:
        top = max(self.mix, key=lambda t: self.mix[t])
        return f"c{self.concurrency}-{top.value}"


def parse_phases(text: str) -> list[Phase]:
    phases = []
    for part in text.split(";"):
        try:
            conc, secs, mix_text = part.split(":")
            mix = {Task(k): float(v) for k, v in (m.split("=") for m in mix_text.split(","))}
            phases.append(Phase(int(conc), float(secs), mix))
        except ValueError as exc:
            raise SystemExit(
                f"--phases {part!r}: expected CONC:SECONDS:task=share,... ({exc})"
            ) from exc
    return phases


@dataclass
class Tally:
    """Tokens by phase and the k chosen, for one policy run."""

    phase_tokens: list[int]
    k_sum: int = 0
    k_count: int = 0
    latencies: list[float] = field(default_factory=list)


def build_prompts(path: Path | None) -> dict[Task, list[str]]:
    if path is None:
        return {t: list(p) for t, p in BUILTIN_PROMPTS.items()}
    prompts: dict[Task, list[str]] = {t: [] for t in Task}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            prompts[Task(row["task"])].append(str(row["prompt"]))
    return prompts


def encode(tokenizer: Any, text: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(text))


async def run_policy(
    engine: Any,
    args: argparse.Namespace,
    phases: list[Phase],
    prompts: dict[Task, list[str]],
    controller: Any,
) -> Tally:
    from engines.embedded.events import SamplingParams

    starts = [sum(p.duration_s for p in phases[:i]) for i in range(len(phases))]
    total_s = sum(p.duration_s for p in phases)
    tally = Tally([0] * len(phases))
    t0 = time.perf_counter()

    def phase_at(t: float) -> int:
        return max(i for i, s in enumerate(starts) if s <= t)

    async def client(c: int) -> None:
        counters: dict[int, int] = {}
        while (t := time.perf_counter() - t0) < total_s:
            p = phase_at(t)
            if c >= phases[p].concurrency:
                nxt = starts[p + 1] if p + 1 < len(phases) else total_s
                await asyncio.sleep(max(0.0, nxt - t))
                continue
            index = counters[p] = counters.get(p, 0) + 1
            rng = random.Random(f"{args.seed}:{p}:{c}:{index}")
            mix = phases[p].mix
            task = rng.choices(list(mix), weights=list(mix.values()))[0]
            text = rng.choice(prompts[task]).format(n=rng.randint(2, 999))
            params = SamplingParams(max_new_tokens=rng.randint(*args.output_tokens))
            k_fixed = controller if isinstance(controller, int) else None
            spec = (lambda _v, k=k_fixed: k) if k_fixed is not None else controller
            sent = time.perf_counter()
            context: dict[str, Any] = {"task": task}
            async for event in engine.generate(
                encode(engine.tokenizer, text), params, spec, context
            ):
                now = time.perf_counter() - t0
                if now < total_s:
                    tally.phase_tokens[phase_at(now)] += len(event.token_ids)
                if event.report is not None:
                    tally.k_sum += event.report.spec_tokens
                    tally.k_count += 1
                    if k_fixed is None:
                        controller.record(task, event.report)
            tally.latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(client(c) for c in range(max(p.concurrency for p in phases))))
    return tally


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from engines.embedded.api import AsyncEngine

    phases = parse_phases(args.phases)
    prompts = build_prompts(args.prompts)
    engine = AsyncEngine.load(
        args.target,
        args.draft,
        device=args.device,
        max_batch_size=max(p.concurrency for p in phases),
        max_seq_len=args.max_seq_len,
    )
    spec = GoodputSpec(cost_table=str(args.cost_table) if args.cost_table else None)
    policies: list[tuple[str, Any]] = [("no-spec", 0)]
    policies += [(f"static-k{k}", k) for k in args.static]
    policies.append(("goodput", "goodput"))
    warm = [Phase(min(8, p.concurrency), 5.0, p.mix) for p in phases[:2]]
    await run_policy(engine, args, warm, prompts, 15)  # capture graphs, warm caches
    results: dict[str, Any] = {}
    for name, how in policies:
        if how == "goodput":
            models = OnlineModels.from_spec(spec, engine.block_size)
            policy = GoodputPolicy(spec)
            controller: Any = StepController(
                lambda p=policy: p, models, engine.block_size, rng=random.Random(args.seed)
            )
        else:
            controller = how
        started = time.perf_counter()
        tally = await run_policy(engine, args, phases, prompts, controller)
        total = sum(p.duration_s for p in phases)
        results[name] = {
            "tok_s": sum(tally.phase_tokens) / total,
            "phases": {
                ph.name: tally.phase_tokens[i] / ph.duration_s for i, ph in enumerate(phases)
            },
            "mean_spec_tokens": tally.k_sum / max(1, tally.k_count),
            "requests": len(tally.latencies),
            "wall_s": time.perf_counter() - started,
        }
        print(
            f"{name:<12} {results[name]['tok_s']:8.1f} tok/s  {results[name]['phases']}",
            file=sys.stderr,
            flush=True,
        )
    await engine.close()
    statics = [r["tok_s"] for n, r in results.items() if n.startswith("static-k")]
    return {
        "device": engine.device,
        "target": str(args.target),
        "draft": str(args.draft),
        "cost_table": str(args.cost_table),
        "phases": [
            {
                "name": p.name,
                "concurrency": p.concurrency,
                "duration_s": p.duration_s,
                "mix": {t.value: w for t, w in p.mix.items()},
            }
            for p in phases
        ],
        "policies": results,
        "goodput_vs_best_static": results["goodput"]["tok_s"] / max(statics) if statics else None,
        "goodput_vs_no_spec": results["goodput"]["tok_s"] / results["no-spec"]["tok_s"],
        "command": " ".join(sys.argv),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="target model directory")
    parser.add_argument("--draft", type=Path, required=True, help="DFlash draft directory")
    parser.add_argument("--cost-table", type=Path, help="measured cost table JSON")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--phases", default=DEFAULT_PHASES)
    parser.add_argument("--static", type=lambda s: [int(x) for x in s.split(",")], default=[7, 15])
    parser.add_argument("--prompts", type=Path, help="JSONL of {task, prompt}")
    parser.add_argument(
        "--output-tokens",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        default=(128, 384),
        help="uniform range of max_new_tokens: LO,HI",
    )
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(main_async(args))
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
