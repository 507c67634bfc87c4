"""Static k vs goodput on the real embedded engine: wall-clock tokens/s over a shifting load.

One run loads the engine once, warms it up, then replays the same closed-loop request
sequence (phases of concurrency and task mix, like scenarios/mixed-shift.yaml) under each
policy: no-spec, static-k<N> for each --static value, and goodput (the goodput settings fed by
OnlineModels through the engine's spec_controller: ``goodput`` chooses one k per engine step
for the whole batch, as the engine pads every row to the widest verify width —
``policies.batch_width.BatchWidth``; with ``--per-request`` also ``goodput-per-request``, the
GoodputPolicy asked per request per step, the earlier wiring). Prints a table and one JSON
object (also written to --out). For goodput it also reports the controller's own time per
engine step (host time on the engine thread, inside the step's wall clock).

    python bench/goodput_gpu.py --target DIR --draft DIR \
        --cost-table cost_tables/qwen3-8b-h200.json --out "$OUT/goodput_gpu.json"

Per policy it also reports tokens/s, mean k and the share of k = 0 steps per phase, and the mean
accept length per task (a static k = block - 1 run measures the pair's full-block acceptance).
The goodput policy's OnlineModels see every engine step's measured time (the cost table is
refined online, as the daemon's embedded adapter does). --out is rewritten after every policy,
so a run stopped midway keeps the policies it finished. bench/h200_goodput_run.sh is the
one-call H200 driver (train the testbed pair, profile its cost, run this).

A phase's concurrency is exact: when a phase starts with fewer clients, the surplus clients'
requests are ended (the engine aborts them) and at the end of the trace every request is; the
tokens they emitted until then count. Phases: "CONCURRENCY:SECONDS:task=share,...;..."
(default 1 -> 32 -> 8 clients, math-heavy -> mixed -> chat-heavy, 40 s each).
Prompts: --prompts FILE.jsonl with {"task", "prompt"} lines, else a small built-in set (varied
by index) so that the script needs nothing outside the repo.
Goodput settings: --goodput-config FILE, a YAML mapping of the policy file's `goodput:` keys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.cost_tables import goodput_cost_table
from engines.step_controller import FixedPolicySource, StepController
from policies.costmodel import padded_width
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec, PolicySpec
from policies.online import OnlineModels
from policies.types import Task
from policies.validation import InvalidDocument, validate_yaml

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
    """Tokens and steps by phase, acceptance by task, for one policy run."""

    phase_tokens: list[int]
    phase_k_sum: list[int]
    phase_steps: list[int]
    phase_no_draft: list[int]
    task_steps: dict[str, int] = field(default_factory=dict)
    task_accepted: dict[str, int] = field(default_factory=dict)
    task_k_sum: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    aborted: int = 0

    @classmethod
    def empty(cls, num_phases: int) -> Tally:
        return cls([0] * num_phases, [0] * num_phases, [0] * num_phases, [0] * num_phases)

    def add_step(self, phase: int | None, task: Task, spec_tokens: int, accepted: int) -> None:
        if phase is not None:
            self.phase_k_sum[phase] += spec_tokens
            self.phase_steps[phase] += 1
            self.phase_no_draft[phase] += spec_tokens == 0
        name = task.value
        self.task_steps[name] = self.task_steps.get(name, 0) + 1
        self.task_accepted[name] = self.task_accepted.get(name, 0) + accepted
        self.task_k_sum[name] = self.task_k_sum.get(name, 0) + spec_tokens

    def by_task(self) -> dict[str, dict[str, float]]:
        return {
            t: {
                "steps": n,
                "mean_accept_length": self.task_accepted[t] / n,
                "mean_spec_tokens": self.task_k_sum[t] / n,
            }
            for t, n in sorted(self.task_steps.items())
        }


class StepTimeFeed:
    """Folds each engine step's measured time into OnlineModels' cost correction.

    Every request of a step reports the same ``step_time_s`` and ``batch_size``; once all
    ``batch_size`` reports of a step arrived, the step is recorded at the width the engine
    actually ran (the widest k of the batch, padded) and drafting share 1 if any row drafted
    (the engine then drafts every row). Runs on the event loop thread, like
    ``StepController.record``; a decision on the engine thread racing with an update reads the
    old or the new correction factor (CostModel swaps its snapshot, never mutates one).
    """

    def __init__(self, models: OnlineModels, multiple: int):
        self._models = models
        self._multiple = multiple
        self._pending: dict[tuple[float, int], list[int]] = {}
        self.steps = 0

    def add(self, step_time_s: float, batch_size: int, spec_tokens: int) -> None:
        key = (step_time_s, batch_size)
        ks = self._pending.setdefault(key, [])
        ks.append(spec_tokens)
        if len(ks) < batch_size:
            return
        del self._pending[key]
        widest = max(ks)
        self._models.record_step_time(
            batch_size, padded_width(widest, self._multiple), float(widest > 0), step_time_s
        )
        self.steps += 1


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


@dataclass
class Probe:
    """What a policy run feeds back: a fixed k, or the goodput controller and its step feed."""

    fixed_k: int | None
    controller: StepController | None = None
    feed: StepTimeFeed | None = None

    def host_figures(self) -> dict[str, float]:
        """Time spent inside the controller: per call and per engine step."""
        if self.controller is None or self.feed is None or not self.controller.calls:
            return {}
        c = self.controller
        return {
            "controller_calls": c.calls,
            "controller_us_per_call": c.host_s / c.calls * 1e6,
            "controller_us_per_step": c.host_s / max(1, self.feed.steps) * 1e6,
        }

    def spec(self, task: Task) -> Any:
        if self.controller is not None:
            return self.controller.start(task, 1.0, 0)
        return lambda _view, k=self.fixed_k: k

    def record(self, task: Task, report: Any) -> None:
        if self.controller is not None:
            self.controller.record(task, report)
        if self.feed is not None:
            self.feed.add(report.step_time_s, report.batch_size, report.spec_tokens)


async def run_policy(
    engine: Any,
    args: argparse.Namespace,
    phases: list[Phase],
    prompts: dict[Task, list[str]],
    probe: Probe,
) -> Tally:
    from engines.embedded.events import SamplingParams

    starts = [sum(p.duration_s for p in phases[:i]) for i in range(len(phases))]
    total_s = sum(p.duration_s for p in phases)
    tally = Tally.empty(len(phases))
    t0 = time.perf_counter()

    def phase_at(t: float) -> int | None:
        return max(i for i, s in enumerate(starts) if s <= t) if t < total_s else None

    async def client(c: int) -> None:
        counters: dict[int, int] = {}
        while (p := phase_at(time.perf_counter() - t0)) is not None:
            if c >= phases[p].concurrency:
                nxt = starts[p + 1] if p + 1 < len(phases) else total_s
                await asyncio.sleep(max(0.0, nxt - (time.perf_counter() - t0)))
                continue
            index = counters[p] = counters.get(p, 0) + 1
            rng = random.Random(f"{args.seed}:{p}:{c}:{index}")
            mix = phases[p].mix
            task = rng.choices(list(mix), weights=list(mix.values()))[0]
            text = rng.choice(prompts[task]).format(n=rng.randint(2, 999))
            params = SamplingParams(max_new_tokens=rng.randint(*args.output_tokens))
            sent = time.perf_counter()
            context: dict[str, Any] = {"task": task}
            stream = engine.generate(
                encode(engine.tokenizer, text), params, probe.spec(task), context
            )
            async with contextlib.aclosing(stream):
                async for event in stream:
                    now = phase_at(time.perf_counter() - t0)
                    if now is not None:
                        tally.phase_tokens[now] += len(event.token_ids)
                    if event.report is not None:
                        report = event.report
                        tally.add_step(now, task, report.spec_tokens, report.accept_length)
                        probe.record(task, report)
                    if event.finished:
                        tally.latencies.append(time.perf_counter() - sent)
                    elif now is None or c >= phases[now].concurrency:
                        tally.aborted += 1  # a phase cut this client: end the request now
                        break

    await asyncio.gather(*(client(c) for c in range(max(p.concurrency for p in phases))))
    return tally


def load_goodput_spec(args: argparse.Namespace) -> GoodputSpec:
    """--goodput-config (the policy file's `goodput:` keys), --cost-table overriding its table.

    The cost table path ends up absolute (a relative one in the file is relative to the file).
    """
    spec, base = GoodputSpec(), Path(".")
    if args.goodput_config is not None:
        try:
            spec = validate_yaml(GoodputSpec, args.goodput_config.read_text())
        except (OSError, InvalidDocument) as exc:
            raise SystemExit(f"--goodput-config {args.goodput_config}: {exc}") from exc
        base = args.goodput_config.parent
    table = args.cost_table or (base / spec.cost_table if spec.cost_table else None)
    if table is not None:
        spec = spec.model_copy(update={"cost_table": str(table.resolve())})
    return spec


def make_probe(how: int | str, spec: GoodputSpec, block_size: int, seed: int) -> Probe:
    if how not in ("goodput", "goodput-per-request"):
        return Probe(int(how))
    models = OnlineModels(spec, block_size, goodput_cost_table(spec))
    source = FixedPolicySource(
        PolicySpec(kind="goodput", goodput=spec), GoodputPolicy(spec), models
    )
    controller = StepController(
        source, block_size, rng=random.Random(seed), shared_width=how == "goodput"
    )
    return Probe(None, controller, StepTimeFeed(models, spec.verify_width_multiple))


def summarise(tally: Tally, phases: list[Phase], wall_s: float) -> dict[str, Any]:
    total = sum(p.duration_s for p in phases)
    return {
        "tok_s": sum(tally.phase_tokens) / total,
        "phases": {
            ph.name: {
                "tok_s": tally.phase_tokens[i] / ph.duration_s,
                "mean_spec_tokens": tally.phase_k_sum[i] / max(1, tally.phase_steps[i]),
                "share_no_draft": tally.phase_no_draft[i] / max(1, tally.phase_steps[i]),
                "request_steps": tally.phase_steps[i],
            }
            for i, ph in enumerate(phases)
        },
        "by_task": tally.by_task(),
        "requests": len(tally.latencies),
        "requests_cut_at_phase_end": tally.aborted,
        "wall_s": wall_s,
    }


def report_document(
    args: argparse.Namespace,
    engine: Any,
    phases: list[Phase],
    spec: GoodputSpec,
    results: dict[str, Any],
) -> dict[str, Any]:
    statics = {n: r["tok_s"] for n, r in results.items() if n.startswith("static-k")}
    goodput = results.get("goodput", {}).get("tok_s")
    no_spec = results.get("no-spec", {}).get("tok_s")
    per_request = results.get("goodput-per-request", {}).get("tok_s")
    best = max(statics, key=lambda n: statics[n]) if statics else None
    return {
        "device": engine.device,
        "target": str(args.target),
        "draft": str(args.draft),
        "block_size": engine.block_size,
        "cost_table": spec.cost_table,
        "goodput_config": spec.model_dump(mode="json"),
        "phases": [
            {
                "name": p.name,
                "concurrency": p.concurrency,
                "duration_s": p.duration_s,
                "mix": {t.value: w for t, w in p.mix.items()},
            }
            for p in phases
        ],
        "output_tokens": list(args.output_tokens),
        "policies": results,
        "best_static": best,
        "goodput_vs_best_static": goodput / statics[best] if goodput and best else None,
        "goodput_vs_no_spec": goodput / no_spec if goodput and no_spec else None,
        "goodput_per_request_vs_best_static": (
            per_request / statics[best] if per_request and best else None
        ),
        "complete": len(results) == 2 + int(args.per_request) + len(args.static),
        "command": " ".join(sys.argv),
    }


def write_report(path: Path | None, document: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=1) + "\n")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from engines.embedded.api import AsyncEngine

    phases = parse_phases(args.phases)
    prompts = build_prompts(args.prompts)
    spec = load_goodput_spec(args)
    started = time.perf_counter()
    engine = AsyncEngine.load(
        args.target,
        args.draft,
        device=args.device,
        max_batch_size=max(p.concurrency for p in phases),
        max_seq_len=args.max_seq_len,
    )
    log(f"engine loaded in {time.perf_counter() - started:.1f} s on {engine.device}")
    policies: list[tuple[str, int | str]] = [("no-spec", 0), ("goodput", "goodput")]
    if args.per_request:
        policies.append(("goodput-per-request", "goodput-per-request"))
    policies += [(f"static-k{k}", k) for k in args.static]
    if args.warmup_s > 0:  # warm allocator and caches at the shapes the trace uses
        warm = [Phase(min(8, p.concurrency), args.warmup_s, p.mix) for p in phases[:2]]
        await run_policy(engine, args, warm, prompts, Probe(engine.block_size - 1))
    results: dict[str, Any] = {}
    document: dict[str, Any] = {}
    for name, how in policies:
        probe = make_probe(how, spec, engine.block_size, args.seed)
        began = time.perf_counter()
        tally = await run_policy(engine, args, phases, prompts, probe)
        results[name] = summarise(tally, phases, time.perf_counter() - began)
        if probe.feed is not None:
            results[name]["timed_steps_fed"] = probe.feed.steps
            results[name] |= probe.host_figures()
        document = report_document(args, engine, phases, spec, results)
        write_report(args.out, document)
        per_phase = {n: round(v["tok_s"], 1) for n, v in results[name]["phases"].items()}
        log(f"{name:<12} {results[name]['tok_s']:8.1f} tok/s  {per_phase}")
    await engine.close()
    return document


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def table(document: dict[str, Any]) -> str:
    """Per policy: overall tok/s, then per phase tok/s and mean k; acceptance by task."""
    names = [p["name"] for p in document["phases"]]
    lines = ["policy       overall  " + "  ".join(f"{n:>18}" for n in names) + "  accept m/c/c"]
    for name, r in document["policies"].items():
        cells = "  ".join(
            f"{r['phases'][n]['tok_s']:9.1f} k={r['phases'][n]['mean_spec_tokens']:5.1f}"
            for n in names
        )
        acc = "/".join(
            f"{r['by_task'].get(t, {}).get('mean_accept_length', 0.0):.2f}"
            for t in ("math", "code", "chat")
        )
        lines.append(f"{name:<12} {r['tok_s']:8.1f}  {cells}  {acc}")
    ratio = document.get("goodput_vs_best_static")
    if ratio is not None:
        lines.append(
            f"goodput / best static ({document['best_static']}) = {ratio:.3f}x, "
            f"/ no-spec = {document['goodput_vs_no_spec']:.3f}x"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="target model directory")
    parser.add_argument("--draft", type=Path, required=True, help="DFlash draft directory")
    parser.add_argument("--cost-table", type=Path, help="measured cost table JSON")
    parser.add_argument(
        "--goodput-config", type=Path, help="YAML of the policy file's goodput: keys"
    )
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
    parser.add_argument(
        "--warmup-s", type=float, default=5.0, help="seconds per warm-up phase (0: none)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--per-request",
        action="store_true",
        help="also run goodput-per-request (the policy asked per request per step)",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here (after each policy)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    document = asyncio.run(main_async(args))
    print(json.dumps(document, indent=1))
    print(table(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
