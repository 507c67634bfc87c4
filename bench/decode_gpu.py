"""Plain decode (batch 1, k = 0) against the weight-read floor, eager vs torch.compile'd forwards.

For each target shape (random bf16 weights, a z-lab style 5-layer block-16 DFlash draft): build
the models once, then two runners over the same weights — CUDA graphs of the eager forwards, and
CUDA graphs of the ``torch.compile``'d forwards — and time, per runner:

- the target-only decode forward (1 token, logits; no draft context insert), CUDA graph replay;
- the engine's verify graph at widths 1 and 16 (target forward + draft context insert);
- the engine's draft graph (one block);
- engine steps at k = 0 and k = 15 on a 512-token prompt (wall clock, sampling and bookkeeping
  included).

The floor is (bytes of weights one decode forward reads) / (measured device-to-device copy
bandwidth, bytes read + written per second): the target's weights without the embedding table
for the target-only forward; plus the draft's context projections (fc and each layer's K/V)
for the engine's k = 0 step, which also updates the draft's context.

Correctness on the device: compiled vs eager logits on the same inputs (max abs difference,
argmax agreement) and the greedy tokens the two engines generate.

Per batch size (``--batches``, default 1,8,64; issue #16's results format, ``batch`` in each
shape): the engine's plain decode step (its width-1 verify graph: target forward, draft
context insert, LM head) at B rows whose context is the prompt, against that batch's floor:
the weights above plus every row's used keys and values (the prompt's, target layers) read
once; ``step_ms`` is the fastest runner's (``runner``), each runner's in ``step_ms_<label>``
(``fastest_runner``; ``--resummarise JSON`` rewrites an earlier run's file so, no device).
``--no-compile`` skips the compiled runner (its start-up took ~4 minutes).
``--compile-scope layer``: the compiled runner compiles the target's decoder-layer step once
for all layers (regional compilation) on its own copy of the models; ``compiled_start_s`` is
then what issue #16's "compiled start-up <= 60 s" asks about. ``--attention sdpa,triton``: an
eager and a compiled runner per attention kernel besides the eager SDPA reference, each on
its own copy of the models (``eager_triton``, ``compiled_triton``: the split-KV Triton
attention; ``step_ms_eager_triton`` / ``step_ms_compiled_triton`` in the batch table; every
runner's logits and engine tokens against the eager SDPA reference).

    python3 bench/decode_gpu.py --out-dir $OUT [--shapes qwen3-8b,qwen3-32b] [--no-compile]
        [--compile-scope forward|layer] [--compile-mode default|max-autotune|coordinate-descent]
        [--attention sdpa,triton] [--linear aten,gemv] [--context insert,defer]

Each shape starts from a fresh dynamo state (``torch._dynamo.reset()``), as a new engine
process would: otherwise the second shape's compiles count against the first's recompile
limit (8 by default), and dynamo silently runs a frame eagerly once the limit is hit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_gpu import hbm_bandwidth_bytes_per_s, identical_prefix, run_engine, sync

from engines.embedded.cuda_graphs import GraphedCall
from engines.embedded.engine import Engine
from engines.embedded.events import (
    ATTENTIONS,
    COMPILE_MODES,
    COMPILE_SCOPES,
    LINEAR_KERNELS,
    Attention,
    CompileMode,
    CompileScope,
    LinearKernel,
)
from engines.embedded.loader import build_models
from engines.embedded.runner import DEFERRED_POSITIONS, GRAPH_BATCH_SIZES, ModelRunner
from engines.embedded.shapes import TARGET_SHAPES, dflash_draft_for

logger = logging.getLogger("bench.decode_gpu")
PROMPT_LEN, NEW_TOKENS = 512, 64
SPEC_BURST = 4  # drafting steps per host round trip in the engine_k15_burst run


def tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def weight_bytes(runner: ModelRunner) -> dict[str, int]:
    """Bytes one decode forward reads: target (no embedding), and the draft context insert."""
    target = tensor_bytes(
        p for n, p in runner.target.named_parameters() if "embed_tokens" not in n
    ) + tensor_bytes(
        b for n, b in runner.target.named_buffers() if n.endswith(("qkv_weight", "gate_up_weight"))
    )
    q_rows = runner.draft.spec.shape.num_heads * runner.draft.spec.shape.head_dim
    draft_context = runner.draft.fc.weight.numel() * runner.draft.fc.weight.element_size()
    for n, b in runner.draft.named_buffers():
        if n.endswith("qkv_weight"):  # the K/V rows only
            draft_context += b[q_rows:].numel() * b.element_size()
    return {"target": target, "draft_context": draft_context}


def kv_bytes_per_row(shape: Any, context: int, dtype_bytes: int = 2) -> int:
    """Bytes of the target's keys and values one row's decode step reads at ``context``
    cached positions (every layer, K and V)."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * context * dtype_bytes


def batch_floor_ms(weights: int, kv_per_row: int, batch: int, bandwidth: float) -> float:
    """The weight-read floor of a batch: the weights once, each row's used K/V once."""
    return 1e3 * (weights + batch * kv_per_row) / bandwidth


def replay_ms(graph: GraphedCall, repeats: int = 100) -> float:
    graph.graph.replay()
    start = sync()
    for _ in range(repeats):
        graph.graph.replay()
    return 1e3 * (sync() - start) / repeats


def target_only_graph(runner: ModelRunner, compiled: bool, pool: Any) -> GraphedCall:
    def forward(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, _ = runner.target(ids, positions, runner.target_cache)
        return runner.target.logits(hidden)

    # Regional compilation: the target's layer step is compiled already; the glue stays eager.
    whole = compiled and runner.compile_scope == "forward"
    fn = torch.compile(forward, fullgraph=True) if whole else forward
    ids = torch.zeros(1, 1, dtype=torch.long, device=runner.device)
    positions = torch.full((1, 1), PROMPT_LEN, dtype=torch.long, device=runner.device)
    with torch.inference_mode():
        return GraphedCall(fn, (ids, positions), pool)


def measure_runner(runner: ModelRunner, prompt: list[int], floors: dict[str, float]) -> dict:
    compiled = runner.compile_forwards
    result: dict[str, Any] = {}
    started = time.perf_counter()
    target_graph = target_only_graph(runner, compiled, torch.cuda.graph_pool_handle())
    result["target_only_capture_s"] = time.perf_counter() - started
    result["target_only_decode_ms"] = replay_ms(target_graph)
    result["target_only_ratio"] = result["target_only_decode_ms"] / floors["target_ms"]
    del target_graph
    for width in (1, 16):
        result[f"verify_{width}_ms"] = replay_ms(runner._graphs["verify", 1, width])
    result["verify_1_ratio"] = result["verify_1_ms"] / floors["target_and_context_ms"]
    result["draft_ms"] = replay_ms(runner._graphs["draft", 1, runner.block_size])
    if runner.defer_context:  # the plain step's forward without the context insert
        result["stash_1_ms"] = replay_ms(runner._graphs["stash", 1, 1])
        result["stash_1_ratio_target"] = result["stash_1_ms"] / floors["target_ms"]
        inserts = runner._graphs["insert_stash", 1, DEFERRED_POSITIONS]
        result["insert_stash_ms"] = replay_ms(inserts)
    # one step per call (drafting bursts, the CUDA default, compared below)
    engine = Engine(runner, 1, PROMPT_LEN + NEW_TOKENS + 8, spec_burst=1)
    run_engine(engine, prompt[:64], 8, 0)  # warm-up
    for label, k in (("k0", 0), ("k15", runner.block_size - 1)):
        run = run_engine(engine, prompt, NEW_TOKENS, k)
        result[f"engine_{label}"] = {
            key: run[key] for key in ("ms_per_step_wall", "ms_per_step_device", "num_steps")
        }
        result[f"engine_{label}"]["output_ids"] = run["output_ids"]
    result["engine_k0_ratio"] = (
        result["engine_k0"]["ms_per_step_wall"] / floors["target_and_context_ms"]
    )
    result["engine_k0_ratio_target"] = result["engine_k0"]["ms_per_step_wall"] / floors["target_ms"]
    # The same k = 0 steps one per call (no plain bursts): what the bursts save a step.
    result["engine_k0"]["plain_burst"] = engine.plain_burst
    result["engine_k0"]["plain_chain"] = engine.plain_chain  # the CUDA default since session 46
    with _setting(engine, "plain_chain", False):  # the bursts read before the next is queued
        _variant(
            result, "engine_k0_unchained", run_engine(engine, prompt, NEW_TOKENS, 0), "engine_k0"
        )
    with _setting(engine, "plain_burst", 1):
        _variant(result, "engine_k0_single", run_engine(engine, prompt, NEW_TOKENS, 0), "engine_k0")
    # k = 15 steps 4 to a host round trip (Engine.spec_burst, the CUDA default) against one a
    # call, on a shorter prompt with more new tokens: a burst needs room for k + 1 tokens a
    # step in every row (the random weights accept almost nothing, so a step emits about
    # one token and the bursts run at full length until the last 64 tokens).
    short, longer = prompt[: PROMPT_LEN // 2], NEW_TOKENS + PROMPT_LEN // 2
    k = runner.block_size - 1
    singles = run_engine(engine, short, longer, k)
    result["engine_k15_long"] = {
        key: singles[key] for key in ("ms_per_step_wall", "ms_per_step_device", "num_steps")
    }
    result["engine_k15_long"]["output_ids"] = singles["output_ids"]
    with _setting(engine, "spec_burst", SPEC_BURST):
        _variant(
            result, "engine_k15_burst", run_engine(engine, short, longer, k), "engine_k15_long"
        )
    result["engine_k15_burst"]["spec_burst"] = SPEC_BURST
    del result["engine_k15_long"]["output_ids"]
    # The same k = 0 steps through the general step (the runner's plain-step path off):
    # what that path saves a step, and that it emits the same tokens.
    with _setting(runner, "plain_fast_path", False):
        _variant(
            result, "engine_k0_general", run_engine(engine, prompt, NEW_TOKENS, 0), "engine_k0"
        )
    return result


@contextlib.contextmanager
def _setting(owner: Any, name: str, value: object) -> Iterator[None]:
    """``owner.name`` set to ``value`` for the block, then restored."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


def _variant(result: dict[str, Any], label: str, run: dict[str, Any], same_as: str) -> None:
    """An engine run beside another of the same prompt: its per-step times and whether it
    emitted the same tokens."""
    result[label] = {
        key: run[key] for key in ("ms_per_step_wall", "ms_per_step_device", "num_steps")
    }
    result[label]["same_tokens"] = run["output_ids"] == result[same_as]["output_ids"]


@torch.inference_mode()
def compare_logits(eager: ModelRunner, compiled: ModelRunner, width: int) -> dict[str, float]:
    torch.manual_seed(width)
    ids = torch.randint(0, eager.target.shape.vocab_size, (1, width), device=eager.device)
    positions = torch.arange(width, device=eager.device)[None] + 100
    reference = eager._verify_forward(ids, positions).float()
    ours = compiled._graphs["verify", 1, width](ids, positions)[:1].float()
    return {
        "max_abs_diff": float((reference - ours).abs().max()),
        "logit_abs_max": float(reference.abs().max()),
        "argmax_agreement": float((reference.argmax(-1) == ours.argmax(-1)).float().mean()),
    }


def measure_batches(
    runner: ModelRunner, batches: list[int], weights: int, bandwidth: float
) -> dict[str, dict[str, float]]:
    """The width-1 verify graph (the engine's plain decode step; a ``defer_context`` runner's
    stashing one) at each batch size, rows at position ``PROMPT_LEN``, against the batch's
    floor (with the draft's context weights, which a deferring runner reads once per
    ``DEFERRED_POSITIONS`` plain steps)."""
    shape = runner.target.shape
    kv = kv_bytes_per_row(shape, PROMPT_LEN)
    out: dict[str, dict[str, float]] = {}
    for batch in batches:
        ids = torch.zeros(batch, 1, dtype=torch.long, device=runner.device)
        positions = torch.full((batch, 1), PROMPT_LEN, dtype=torch.long, device=runner.device)
        if runner.defer_context:  # its plain step: the forward and the stash write
            graph = runner._graphs["stash", batch, 1]
            graph(ids, positions, torch.zeros(batch, dtype=torch.long, device=runner.device))
        else:
            graph = runner._graphs["verify", batch, 1]
            graph(ids, positions)  # the static inputs at this batch's positions
        step_ms = replay_ms(graph)
        floor_ms = batch_floor_ms(weights, kv, batch, bandwidth)
        out[str(batch)] = {"step_ms": step_ms, "floor_ms": floor_ms, "ratio": step_ms / floor_ms}
    return out


def fastest_runner(table: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per batch, ``step_ms`` and ``ratio`` of the fastest runner measured (named in
    ``runner``) beside every runner's own ``step_ms_<label>`` and the ``floor_ms``: issue
    #16's results format, which reports what the engine can do, not only the eager
    reference. A table of an older run (``step_ms`` the eager reference, no
    ``step_ms_eager``) is read as such."""
    out: dict[str, dict[str, Any]] = {}
    for batch, cell in table.items():
        row = {k: v for k, v in cell.items() if k not in ("step_ms", "ratio", "runner")}
        if "step_ms_eager" not in row and "step_ms" in cell:
            row["step_ms_eager"] = cell["step_ms"]
        steps = {k.removeprefix("step_ms_"): v for k, v in row.items() if k.startswith("step_ms_")}
        if not steps:
            raise ValueError(f"batch {batch}: no runner's step_ms in {sorted(cell)}")
        runner = min(steps, key=steps.__getitem__)
        row.update(runner=runner, step_ms=steps[runner], ratio=steps[runner] / row["floor_ms"])
        out[batch] = row
    return out


def resummarise(source: Path, out_dir: Path) -> Path:
    """``decode_gpu.json`` in ``out_dir`` from an earlier run's JSON, each shape's batch table
    put through ``fastest_runner`` (no device needed); the source is named in the result."""
    report = json.loads(source.read_text())
    for shape in report.get("shapes", {}).values():
        if "batch" in shape:
            shape["batch"] = fastest_runner(shape["batch"])
    report["resummarised_from"] = str(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "decode_gpu.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    return out


def measure_shape(
    name: str,
    device: torch.device,
    bandwidth: float,
    batches: list[int] | None = None,
    compile_too: bool = True,
    compile_scope: CompileScope = "forward",
    attentions: tuple[Attention, ...] = ("sdpa",),
    compile_modes: tuple[CompileMode, ...] = ("default",),
    linears: tuple[LinearKernel, ...] = ("aten",),
    contexts: tuple[str, ...] = ("insert",),
    eager_variants: bool = True,
) -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    shape = TARGET_SHAPES[name]
    spec = dflash_draft_for(shape)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    max_seq_len = PROMPT_LEN + NEW_TOKENS + 8
    torch.manual_seed(0)
    target, draft = build_models(shape, spec, device, dtype, max_seq_len + 64)
    runners: dict[str, ModelRunner] = {}
    result: dict[str, Any] = {
        "shape": name,
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "compile_mode": ",".join(compile_modes),
    }
    batches = batches or [1]
    max_batch = max(batches)
    if any(b not in GRAPH_BATCH_SIZES for b in batches):
        raise ValueError(f"batch sizes must be captured ones {GRAPH_BATCH_SIZES}, got {batches}")
    # The reference (eager kernels, SDPA) first; every other runner on its own copy of the
    # models (same seed, same weights): regional compilation swaps the target's layer step and
    # the attention kernel is a model attribute.
    modes: list[tuple[str, bool, Attention, CompileMode, LinearKernel, bool]] = [
        ("eager", False, "sdpa", "default", "aten", False)
    ]
    for attention in attentions:
        for linear in linears:
            for context in contexts:
                defer = context == "defer"
                variant = attention != "sdpa" or linear != "aten" or defer
                if variant and eager_variants:
                    label = runner_label(False, attention, linear=linear, defer=defer)
                    modes.append((label, False, attention, "default", linear, defer))
                for compile_mode in compile_modes if compile_too else ():
                    label = runner_label(True, attention, compile_mode, linear, defer)
                    modes.append((label, True, attention, compile_mode, linear, defer))
    for label, compiled, attention, compile_mode, linear, defer in modes:
        models = (target, draft)
        if label != "eager":
            torch.manual_seed(0)
            models = build_models(shape, spec, device, dtype, max_seq_len + 64)
        started = time.perf_counter()
        try:
            runners[label] = ModelRunner(
                *models,
                device,
                dtype,
                max_batch,
                max_seq_len,
                True,
                compiled,
                compile_scope=compile_scope,
                attention=attention,
                compile_mode=compile_mode,
                linear=linear,
                defer_context=defer,
            )
        except Exception as exc:  # a variant that fails leaves the others measured
            if label == "eager":
                raise
            logger.exception("%s %s runner failed", name, label)
            result[f"{label}_error"] = repr(exc)[:2000]
            continue
        result[f"{label}_start_s"] = time.perf_counter() - started
        logger.info("%s %s runner ready in %.1f s", name, label, result[f"{label}_start_s"])
    sizes = weight_bytes(runners["eager"])
    floors = {
        "target_ms": 1e3 * sizes["target"] / bandwidth,
        "target_and_context_ms": 1e3 * (sizes["target"] + sizes["draft_context"]) / bandwidth,
    }
    result.update(weight_bytes=sizes, floors_ms=floors)
    prompt = torch.randint(0, shape.vocab_size, (PROMPT_LEN,)).tolist()
    for label, runner in runners.items():
        result[label] = measure_runner(runner, prompt, floors)
        logger.info("%s %s: %s", name, label, json.dumps(result[label])[:600])
    weights = sizes["target"] + sizes["draft_context"]
    with torch.inference_mode():
        table: dict[str, dict[str, Any]] = {}
        for label, runner in runners.items():
            for batch, cell in measure_batches(runner, batches, weights, bandwidth).items():
                row = table.setdefault(batch, {"floor_ms": cell["floor_ms"]})
                row[f"step_ms_{label}"] = cell["step_ms"]
        result["batch"] = fastest_runner(table)
    logger.info("%s per batch: %s", name, result["batch"])
    eager_ids = {key: result["eager"][key].pop("output_ids") for key in ("engine_k0", "engine_k15")}
    for label in runners:
        if label == "eager":
            continue
        versus = result[f"{label}_vs_eager"] = {
            f"verify_{w}_logits": compare_logits(runners["eager"], runners[label], w)
            for w in (1, 16)
        }
        for key in ("engine_k0", "engine_k15"):
            versus[f"{key}_identical_prefix_tokens"] = identical_prefix(
                eager_ids[key], result[label][key].pop("output_ids")
            )
    if len(runners) == 1:
        return result
    result["dynamo"] = {
        "unique_graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }
    del runners, target, draft
    torch.cuda.empty_cache()
    return result


def runner_label(
    compiled: bool,
    attention: Attention,
    mode: CompileMode = "default",
    linear: LinearKernel = "aten",
    defer: bool = False,
) -> str:
    """eager, compiled (SDPA), eager_triton, compiled_triton; a compile mode other than the
    default is appended (compiled_triton_max_autotune, compiled_coordinate_descent), then the
    gemv linear kernel (compiled_triton_gemv) and the deferred context (..._defer)."""
    kernels = "compiled" if compiled else "eager"
    label = kernels if attention == "sdpa" else f"{kernels}_{attention}"
    label = label if mode == "default" else f"{label}_{mode.replace('-', '_')}"
    label = label if linear == "aten" else f"{label}_{linear}"
    return f"{label}_defer" if defer else label


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--shapes", default="qwen3-8b,qwen3-32b", help="comma-separated names")
    parser.add_argument(
        "--batches", default="1,8,64", help="batch sizes of the plain-step table (captured ones)"
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled runner")
    parser.add_argument(
        "--compile-scope",
        choices=COMPILE_SCOPES,
        default="forward",
        help="what the compiled runner compiles: each forward whole, or the target's layer "
        "step once for all layers (regional; its start-up is compiled_start_s)",
    )
    parser.add_argument(
        "--compile-mode",
        default="default",
        help="comma-separated: how the compiled runners compile, one runner per mode and "
        "attention: " + ", ".join(COMPILE_MODES) + " (engines/embedded/events.py)",
    )
    parser.add_argument(
        "--attention",
        default="sdpa",
        help="comma-separated attention kernels, one compiled runner each: "
        + ", ".join(ATTENTIONS),
    )
    parser.add_argument(
        "--linear",
        default="aten",
        help="comma-separated linear kernels, runners for each: "
        + ", ".join(LINEAR_KERNELS)
        + " (gemv: engines/embedded/gemv.py, steps of up to 16 tokens; fused: gemv with the "
        "layers' norms, gate and residual adds inside it at one token, the CUDA default)",
    )
    parser.add_argument(
        "--context",
        default="insert",
        help="comma-separated: insert (the draft's context written every step) and/or defer "
        "(k = 0 steps stash it: ModelRunner(defer_context=True)), runners for each",
    )
    parser.add_argument(
        "--compiled-only",
        action="store_true",
        help="besides the eager SDPA reference, only compiled runners (each runner holds its "
        "own copy of the weights: nine 8B runners do not fit one GPU)",
    )
    parser.add_argument(
        "--resummarise",
        type=Path,
        metavar="JSON",
        help="measure nothing: write OUT_DIR/decode_gpu.json from this earlier run's JSON with "
        "each batch table's step_ms the fastest runner's (no device needed)",
    )
    args = parser.parse_args()
    if args.resummarise is not None:
        if not args.resummarise.is_file():
            parser.error(f"--resummarise {args.resummarise}: no such file")
        args.out_dir.mkdir(parents=True, exist_ok=True)
        print(resummarise(args.resummarise, args.out_dir))
        return 0
    batches = [int(b) for b in args.batches.split(",")]
    attentions = tuple(args.attention.split(","))
    if unknown := [a for a in attentions if a not in ATTENTIONS]:
        parser.error(f"--attention: unknown {unknown}; use {', '.join(ATTENTIONS)}")
    compile_modes = tuple(args.compile_mode.split(","))
    if unknown := [m for m in compile_modes if m not in COMPILE_MODES]:
        parser.error(f"--compile-mode: unknown {unknown}; use {', '.join(COMPILE_MODES)}")
    linears = tuple(args.linear.split(","))
    if unknown := [m for m in linears if m not in LINEAR_KERNELS]:
        parser.error(f"--linear: unknown {unknown}; use {', '.join(LINEAR_KERNELS)}")
    contexts = tuple(args.context.split(","))
    if unknown := [c for c in contexts if c not in ("insert", "defer")]:
        parser.error(f"--context: unknown {unknown}; use insert, defer")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (CUDA graphs)")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    torch._dynamo.config.recompile_limit = 64  # widths 16, 8, 1 + the target-only forward
    report: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "hbm_copy_bytes_per_s": hbm_bandwidth_bytes_per_s(),
        "shapes": {},
    }
    for name in args.shapes.split(","):
        try:
            report["shapes"][name] = measure_shape(
                name,
                device,
                report["hbm_copy_bytes_per_s"],
                batches,
                not args.no_compile,
                args.compile_scope,
                attentions,  # type: ignore[arg-type]
                compile_modes,  # type: ignore[arg-type]
                linears,  # type: ignore[arg-type]
                contexts,
                not args.compiled_only,
            )
        except Exception as exc:  # keep the shapes already measured
            logger.exception("shape %s failed", name)
            report["shapes"][name] = {"error": repr(exc)}
        (args.out_dir / "decode_gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
