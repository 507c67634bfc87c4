"""The engines the harness measures: random-weight Qwen3 shapes with synthetic acceptance, or a
trained pair with its real acceptance (and a greedy exactness check)."""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from bench.decisions import exactness
from bench.decisions.driver import UNSEEN_END_BLOCKS
from bench.decisions.policies import Context
from bench.engine_gpu import TINY  # the engine benchmark's CPU smoke shape
from engines.cost_tables import load_cost_table
from engines.embedded.checkpoint import target_shape
from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams
from engines.embedded.loader import build_models, load_runner
from engines.embedded.profiler import measure_cost_table
from engines.embedded.request import Request
from engines.embedded.runner import ModelRunner
from engines.embedded.shapes import TARGET_SHAPES, dflash_draft_for
from engines.embedded.step_profile import profile_engine
from engines.embedded.synthetic import SyntheticAcceptance
from engines.embedded.synthetic_profiles import load_profile_set
from policies.costmodel import CostTable
from policies.model import GoodputSpec
from policies.types import Task, max_spec_tokens

ROOT = Path(__file__).resolve().parents[2]
MAX_BATCH = 64
COST_TABLES = {
    "synthetic-8b": ROOT / "cost_tables/qwen3-8b-h200.json",
    "synthetic-32b": ROOT / "cost_tables/qwen3-32b-h200.json",
    "synthetic-tiny": ROOT / "cost_tables/qwen3-8b-h200.json",  # a stand-in: CPU smoke only
}
# --cost-table engine: price the policies with the arm's own engine steps, profiled at start-up.
ENGINE_PROFILE = "engine"
SHAPES = {
    "synthetic-8b": TARGET_SHAPES["qwen3-8b"],
    "synthetic-32b": TARGET_SHAPES["qwen3-32b"],
    "synthetic-tiny": TINY,
}
PromptFor = Callable[[random.Random, Task, int], list[int]]


@dataclass
class Arm:
    engine: Engine
    context: Context
    prompt_for: PromptFor
    device_name: str
    info: dict[str, Any] = field(default_factory=dict)
    exactness_prompts: list[list[int]] = field(default_factory=list)

    def warm_up(self, prompt_tokens: tuple[int, int]) -> None:
        """Every captured batch size and verify width, and prefills of every prompt length the
        trace uses (eager kernels pick their algorithms on first use of a shape)."""
        lengths = list(range(prompt_tokens[0], prompt_tokens[1] + 1))
        top = max_spec_tokens(self.context.block_size)
        ks: list[int | None] = [0, 7, top]
        if self.context.verify_mode == "ragged":
            ks.append(None)  # every row its own k: the ragged graphs' token buckets
        for k in ks:
            for batch in (1, 8, MAX_BATCH):
                requests = [
                    Request(
                        f"warm-{k}-{batch}-{i}",
                        self.prompt_for(random.Random(i), Task.CHAT, lengths[i % len(lengths)]),
                        SamplingParams(max_new_tokens=24),
                        _fixed_k(k if k is not None else (i * 7) % (top + 1)),
                        {"task": "chat", "synthetic_key": f"warm-{i}"},
                    )
                    for i in range(batch)
                ]
                exactness.run_all(self.engine, requests)
        for start in range(0, len(lengths), MAX_BATCH):
            requests = [
                Request(
                    f"warm-prefill-{n}",
                    self.prompt_for(random.Random(n), Task.CHAT, n),
                    SamplingParams(max_new_tokens=1),
                    lambda v: 0,
                    {"task": "chat"},
                )
                for n in lengths[start : start + MAX_BATCH]
            ]
            exactness.run_all(self.engine, requests)

    def exactness(self, num_prompts: int) -> dict[str, Any]:
        """bench/decisions/exactness.py on this engine (real acceptance only: synthetic mode is
        not lossless by design)."""
        target = self.info.get("target")
        prompts = self.exactness_prompts[:num_prompts]
        return exactness.check(self.engine, prompts, Path(target) if target else None)


def _fixed_k(k: int) -> Callable[[Any], int]:
    """A controller that always asks for k."""
    return lambda view: k


def load_arm(args: argparse.Namespace) -> Arm:
    if args.arm == "real-pair":
        return _real_pair(args)
    return _synthetic(args)


def _synthetic(args: argparse.Namespace) -> Arm:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = SHAPES[args.arm]
    spec = dflash_draft_for(shape)
    max_seq_len = _max_seq_len(args, spec.block_size)
    torch.manual_seed(args.seed)
    target, draft = build_models(shape, spec, device, dtype, max_seq_len + 2 * spec.block_size)
    synthetic = load_profile_set(args.profiles, seed=args.seed)
    runner = ModelRunner(
        target,
        draft,
        device,
        dtype,
        MAX_BATCH,
        max_seq_len,
        device.type == "cuda",
        synthetic=synthetic,
        verify_mode=args.verify_mode,
        **_compile(args),
    )
    engine = _engine(runner, max_seq_len, args)
    if args.cost_table == ENGINE_PROFILE:
        table = _engine_table(engine)
    else:
        table = load_cost_table(Path(args.cost_table) if args.cost_table else COST_TABLES[args.arm])
    vocab = shape.vocab_size

    def prompt_for(rng: random.Random, task: Task, length: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(length)]

    context = _context(spec.block_size, table, _synthetic_rates(synthetic), synthetic, args)
    info = {
        "shape": args.arm,
        "verify_mode": args.verify_mode,
        **_kernel_info(args),
        "block_size": spec.block_size,
        "synthetic": synthetic.describe(),
        "cost_table": str(table.source),
        **_table_ms(table, args),
        "global_rates": _rounded(context.global_rates),
    }
    return Arm(engine, context, prompt_for, _device_name(device), info)


def _real_pair(args: argparse.Namespace) -> Arm:
    from transformers import AutoTokenizer

    device = torch.device(args.device)
    max_seq_len = 1024  # prompts are cut to 400 tokens; outputs --output-tokens (default 512)
    if getattr(args, "ends", "length") == "unseen":
        max_seq_len += UNSEEN_END_BLOCKS * 64  # (any block size up to 64)
    runner = load_runner(
        args.target,
        args.draft,
        device,
        MAX_BATCH,
        max_seq_len,
        verify_mode=args.verify_mode,
        **_compile(args),
    )
    tokenizer = AutoTokenizer.from_pretrained(str(args.target), local_files_only=True)
    by_task: dict[Task, list[list[int]]] = defaultdict(list)
    for line in args.prompts.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": row["prompt"]}],
                add_generation_prompt=True,
                tokenize=False,
            )
            ids = list(tokenizer.encode(text, add_special_tokens=False))[-400:]
            by_task[Task(row["task"])].append(ids)

    def prompt_for(rng: random.Random, task: Task, length: int) -> list[int]:
        return list(rng.choice(by_task[task]))

    engine = _engine(runner, max_seq_len, args)
    if args.cost_table == ENGINE_PROFILE:
        table = _engine_table(engine)
    else:
        table = _profiled_table(args, runner, device)
    rates = _measured_rates(engine, prompt_for)
    context = _context(runner.block_size, table, rates, None, args)
    info = {
        "target": str(args.target),
        "draft": str(args.draft),
        "verify_mode": args.verify_mode,
        **_kernel_info(args),
        "block_size": runner.block_size,
        "cost_table": str(table.source),
        **_table_ms(table, args),
        "measured_rates": _rounded(rates),
        "accept_length_k_max": {t.value: 1 + sum(_cumprod(r)) for t, r in rates.items()},
    }
    # Tasks interleaved, so any prefix of the list (--exactness-prompts) mixes them.
    lists = [by_task[task] for task in Task]
    mixed = [p[i] for i in range(max(map(len, lists))) for p in lists if i < len(p)]
    return Arm(engine, context, prompt_for, _device_name(device), info, mixed)


def _compile(args: argparse.Namespace) -> dict[str, Any]:
    """The runner's kernel arguments: torch.compile for ``--compile-scope`` (off: eager
    kernels) and the attention kernel (``--attention``)."""
    kernels = {
        "attention": args.attention,
        "linear": args.linear,
        "defer_context": args.defer_context,
    }
    if args.compile_scope == "off":
        return kernels
    return {
        "compile_forwards": True,
        "compile_scope": args.compile_scope,
        "compile_mode": args.compile_mode,
        **kernels,
    }


def _engine(runner: Any, max_seq_len: int, args: argparse.Namespace) -> Engine:
    """The arm's engine, with the bursts asked for (``--plain-burst``, ``--spec-burst``)."""
    return Engine(
        runner,
        MAX_BATCH,
        max_seq_len,
        plain_burst=args.plain_burst,
        spec_burst=args.spec_burst,
        plain_chain=getattr(args, "plain_chain", False),
    )


def _kernel_info(args: argparse.Namespace) -> dict[str, Any]:
    """What the arm info records of the runner's kernels beyond the defaults (calls of
    different kernels do not pool)."""
    return {
        **({"compile_scope": args.compile_scope} if args.compile_scope != "off" else {}),
        **({"attention": args.attention} if args.attention != "sdpa" else {}),
        **({"compile_mode": args.compile_mode} if args.compile_mode != "default" else {}),
        **({"linear": args.linear} if args.linear != "aten" else {}),
        **({"defer_context": True} if args.defer_context else {}),
        **({"plain_burst": args.plain_burst} if args.plain_burst != 1 else {}),
        **({"plain_chain": True} if getattr(args, "plain_chain", False) else {}),
        **({"spec_burst": args.spec_burst} if args.spec_burst != 1 else {}),
        **({"ends": args.ends} if getattr(args, "ends", "length") != "length" else {}),
    }


def _context(
    block_size: int,
    table: CostTable,
    rates: dict[Task, list[float]],
    synthetic: SyntheticAcceptance | None,
    args: argparse.Namespace,
) -> Context:
    from bench.decisions.workload import overall_mix, parse_phases

    mix = overall_mix(parse_phases(args.phases, args.scale))
    return Context(
        block_size,
        MAX_BATCH,
        table,
        GoodputSpec(),
        rates,
        mix,
        synthetic,
        args.seed,
        args.verify_mode,
    )


def _synthetic_rates(synthetic: SyntheticAcceptance, draws: int = 4000) -> dict[Task, list[float]]:
    """The population's conditional acceptance per position (request and drift offsets
    included), from the profile's own draws: the "global acceptance" a fleet would measure."""
    n = synthetic.num_positions
    out = {}
    for task in Task:
        keys = [f"global-{i}" for i in range(draws)]
        runs = synthetic.accept_runs([task.value] * draws, keys, [i % 50 for i in range(draws)], n)
        out[task] = _conditional([int(r) for r in runs], n)
    return out


def _measured_rates(engine: Engine, prompt_for: PromptFor) -> dict[Task, list[float]]:
    """Per-task conditional acceptance of the pair at k = block - 1 (64 requests per task)."""
    k = max_spec_tokens(engine.block_size)
    out = {}
    for task in Task:
        requests = [
            Request(
                f"rates-{task.value}-{i}",
                prompt_for(random.Random(i), task, 0),
                SamplingParams(max_new_tokens=96),
                lambda v: k,
                {"task": task.value},
            )
            for i in range(64)
        ]
        exactness.run_all(engine, requests)
        runs = [
            length - 1
            for r in requests
            for length, ran in zip(r.accept_lengths, r.spec_tokens, strict=True)
            if ran == k
        ]
        out[task] = _conditional(runs, k)
    return out


def _conditional(runs: list[int], n: int) -> list[float]:
    """Conditional acceptance per position from accepted-draft counts of full-width steps."""
    rates = []
    for i in range(n):
        reached = sum(1 for r in runs if r >= i)
        rates.append(sum(1 for r in runs if r > i) / reached if reached else 0.0)
    return rates


def _engine_table(engine: Engine) -> CostTable:
    """The arm's own engine steps timed at start-up, as the daemon's embedded backend prices
    the goodput policy (``cost_profile``, engines/embedded/step_profile.py): its kernels, its
    verify layout and the draft, where the committed tables are eager SDPA target forwards."""
    started = time.perf_counter()

    def point(batch: int, width: int, seconds: float) -> None:
        print(f"  cost profile {batch}x{width}: {1e3 * seconds:.2f} ms", flush=True)

    def bucket(batch: int, tokens: int, seconds: float) -> None:
        print(f"  cost profile {batch} rows, {tokens} tokens: {1e3 * seconds:.2f} ms", flush=True)

    table = profile_engine(engine, MAX_BATCH, on_point=point, on_bucket=bucket)
    print(f"profiled the engine's steps in {time.perf_counter() - started:.0f} s", flush=True)
    return replace(table, source="engine steps profiled at start-up (step_profile.py)")


def _table_ms(table: CostTable, args: argparse.Namespace) -> dict[str, Any]:
    """The engine's start-up profile as the results file keeps it (ms per step, by batch size
    and width); nothing for a committed table."""
    if args.cost_table != ENGINE_PROFILE:
        return {}
    by_batch = {
        str(batch): {
            str(width): round(1e3 * seconds, 3)
            for width, seconds in zip(table.tokens_per_request, row, strict=True)
        }
        for batch, row in zip(table.batch_sizes, table.step_time_s, strict=True)
    }
    buckets = {
        str(batch): {str(n): round(1e3 * seconds, 3) for n, seconds in points}
        for batch, points in table.token_buckets
    }
    return {"cost_table_ms": by_batch, **({"cost_buckets_ms": buckets} if buckets else {})}


def _profiled_table(args: argparse.Namespace, runner: ModelRunner, device: torch.device) -> Any:
    if args.cost_table is not None:
        return load_cost_table(Path(args.cost_table))
    batches, tokens = [1, 2, 4, 8, 16, 32, 64], [1, 8, 16]
    started = time.perf_counter()
    table = measure_cost_table(target_shape(args.target), 512, batches, tokens, 10, str(device))
    print(f"profiled the pair's cost table in {time.perf_counter() - started:.0f} s", flush=True)
    return CostTable.from_dict(
        {"batch_sizes": batches, "tokens_per_request": tokens, "step_time_s": table},
        source="profiled",
    )


def _max_seq_len(args: argparse.Namespace, block_size: int) -> int:
    """Room for the longest prompt and output, two blocks, and the room past each output's
    end that ``--ends unseen`` states (``UNSEEN_END_BLOCKS``), in multiples of 64."""
    prompt = int(args.prompt_tokens.split(",")[1])
    output = int(args.output_tokens.split(",")[1])
    if getattr(args, "ends", "length") == "unseen":
        output += UNSEEN_END_BLOCKS * block_size
    return -(-(prompt + output + 2 * block_size) // 64) * 64


def _cumprod(rates: list[float]) -> list[float]:
    out, running = [], 1.0
    for r in rates:
        running *= r
        out.append(running)
    return out


def _rounded(rates: dict[Task, list[float]]) -> dict[str, list[float]]:
    return {t.value: [round(r, 4) for r in v] for t, v in rates.items()}


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
