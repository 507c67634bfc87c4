"""Embedded-engine GPU benchmark, one device call: engine vs the dflash reference loop, plain
decode vs HBM bandwidth, and the verify cost tables for Qwen3-8B / Qwen3-32B shapes.

    python bench/engine_gpu.py --out-dir $OUT            # H200: everything (about 3-4 min)
    python bench/engine_gpu.py --smoke --out-dir /tmp/x  # CPU, tiny shape: checks the code

How the work is made equal (section "reference"): engine and reference get the *same* random
bf16 weights (the engine loads the reference models' state dicts), the same 512-token prompt,
block 16, batch 1, greedy, the same number of new tokens. The engine runs k = 15 every step, so
each step is one 16-wide draft forward plus one 16-wide target verify, exactly the reference's
step; with random weights both accept ~nothing, so both run ~one step per token. The JSON
records both step counts and accept lengths so the equality can be checked.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.embedded.checkpoint import ModelShape
from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams
from engines.embedded.loader import build_models
from engines.embedded.profiler import cost_table_document, measure_cost_table
from engines.embedded.request import Request
from engines.embedded.runner import ModelRunner
from engines.embedded.shapes import TARGET_SHAPES, TINY_SHAPE, dflash_draft_for

logger = logging.getLogger("bench.engine_gpu")
TINY = TINY_SHAPE


def sync() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def hbm_bandwidth_bytes_per_s(num_bytes: int = 4 << 30) -> float:
    """Device-to-device copy: bytes read + written per second."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start = sync()
    for _ in range(10):
        dst.copy_(src)
    elapsed = sync() - start
    del src, dst
    return 2 * num_bytes * 10 / elapsed


def reference_models(shape: ModelShape, device: torch.device, dtype: torch.dtype) -> tuple:
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    spec = dflash_draft_for(shape)
    common = dict(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        rms_norm_eps=shape.rms_norm_eps,
        rope_theta=shape.rope_theta,
        max_position_embeddings=4096,
        tie_word_embeddings=shape.tie_word_embeddings,
    )
    target_cfg = Qwen3Config(num_hidden_layers=shape.num_layers, **common)
    draft_cfg = Qwen3Config(
        num_hidden_layers=spec.shape.num_layers,
        num_target_layers=shape.num_layers,
        block_size=spec.block_size,
        dflash_config={
            "block_size": spec.block_size,
            "target_layer_ids": list(spec.target_layer_ids),
            "mask_token_id": spec.mask_token_id,
        },
        **common,
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            target = Qwen3ForCausalLM(target_cfg).eval()
            draft = DFlashDraftModel(draft_cfg).eval()
    finally:
        torch.set_default_dtype(previous)
    return target, draft, spec


def engine_from(
    target: Any,
    draft: Any,
    shape: ModelShape,
    spec: Any,
    device: torch.device,
    dtype: torch.dtype,
    max_seq_len: int,
) -> Engine:
    draft_state = {k: v for k, v in draft.state_dict().items() if "rotary" not in k}
    ours_t, ours_d = build_models(
        shape, spec, device, dtype, max_seq_len + 64, target.state_dict(), draft_state
    )
    runner = ModelRunner(
        ours_t, ours_d, device, dtype, 1, max_seq_len, use_cuda_graphs=device.type == "cuda"
    )
    return Engine(runner, 1, max_seq_len, spec_burst=1)  # timed one step a call


def run_engine(engine: Engine, prompt: list[int], new_tokens: int, k: int) -> dict[str, Any]:
    request = Request(
        "bench", prompt, SamplingParams(max_new_tokens=new_tokens), lambda view: k, {}
    )
    engine.add(request)
    engine.step()  # prefill + first step (not timed)
    walls, device_times = [], []
    while engine.has_work:
        start = time.perf_counter()
        events = engine.step()
        walls.append(time.perf_counter() - start)
        device_times += [e.report.step_time_s for _, e in events if e.report]
    return {
        "output_ids": request.output_ids,
        "accept_lengths": request.accept_lengths,
        "num_steps": len(request.accept_lengths),
        # Per step, not per call: a call may run a burst of plain steps (Engine.plain_burst).
        "ms_per_step_wall": 1e3 * sum(walls) / max(len(device_times), 1),
        "steps_per_call": len(device_times) / max(len(walls), 1),
        "ms_per_step_device": 1e3 * statistics.mean(device_times),
        "tokens_per_s": sum(request.accept_lengths[1:]) / sum(walls),
    }


def identical_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two outputs share."""
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same


def run_reference(
    target: Any, draft: Any, prompt: list[int], new_tokens: int, block: int
) -> dict[str, Any]:
    from dflash.model import dflash_generate

    ids = torch.tensor([prompt], device=target.device)
    if not torch.cuda.is_available():  # return_stats needs CUDA
        start = sync()
        out = dflash_generate(draft, target, ids, new_tokens, None, block_size=block)
        total = sync() - start
        return {"output_ids": out[0, len(prompt) :].tolist(), "ms_total": 1e3 * total}
    stats = dflash_generate(
        draft, target, ids, new_tokens, None, block_size=block, return_stats=True
    )
    decode_s = stats.time_per_output_token * stats.num_output_tokens
    steps = len(stats.acceptance_lengths)
    return {
        "output_ids": stats.output_ids[0, len(prompt) :].tolist(),
        "accept_lengths": stats.acceptance_lengths,
        "num_steps": steps,
        "ms_per_step": 1e3 * decode_s / steps,
        "tokens_per_s": stats.num_output_tokens / decode_s,
    }


@torch.inference_mode()
def time_reference_target_forward(
    target: Any, prompt: list[int], width: int, repeats: int
) -> float:
    """ms per HF target forward of ``width`` tokens on a 512-token cache (dflash's verify call)."""
    from transformers import DynamicCache

    ids = torch.tensor([prompt], device=target.device)
    cache = DynamicCache(config=target.config)
    target(ids, past_key_values=cache, use_cache=True)
    block = ids[:, :width]
    pos = torch.arange(len(prompt), len(prompt) + width, device=target.device)[None]
    times = []
    for _ in range(repeats):
        start = sync()
        target(
            block,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=width > 1,
        )
        times.append(sync() - start)
        cache.crop(len(prompt))
    return 1e3 * statistics.median(times[1:])


def time_graph_ms(runner: ModelRunner, width: int, repeats: int = 50) -> float | None:
    graph = runner._graphs.get(("verify", 1, width))
    if graph is None:
        return None
    start = sync()
    for _ in range(repeats):
        graph.graph.replay()
    return 1e3 * (sync() - start) / repeats


def section_reference(
    shape_name: str,
    shape: ModelShape,
    device: torch.device,
    dtype: torch.dtype,
    prompt_len: int,
    new_tokens: int,
) -> dict[str, Any]:
    torch.manual_seed(0)
    target, draft, spec = reference_models(shape, device, dtype)
    prompt = torch.randint(0, shape.vocab_size, (prompt_len,)).tolist()
    engine = engine_from(target, draft, shape, spec, device, dtype, prompt_len + new_tokens + 8)
    run_reference(target, draft, prompt[:64], 8, spec.block_size)  # warm-up
    run_engine(engine, prompt[:64], 8, spec.block_size - 1)
    result: dict[str, Any] = {
        "shape": shape_name,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "block_size": spec.block_size,
    }
    for label, block, k in (("block16", spec.block_size, spec.block_size - 1), ("block1", 1, 0)):
        ref = run_reference(target, draft, prompt, new_tokens, block)
        ours = run_engine(engine, prompt, new_tokens, k)
        same = identical_prefix(ref["output_ids"], ours["output_ids"])
        result[label] = {
            "reference": {k_: v for k_, v in ref.items() if k_ != "output_ids"},
            "engine": {k_: v for k_, v in ours.items() if k_ != "output_ids"},
            "identical_prefix_tokens": same,
        }
        if "ms_per_step" in ref:
            result[label]["speedup_per_step"] = ref["ms_per_step"] / ours["ms_per_step_wall"]
        logger.info("%s %s: %s", shape_name, label, json.dumps(result[label])[:400])
    if device.type == "cuda":
        result["target_forward_ms"] = {
            "reference_hf_16": time_reference_target_forward(target, prompt, 16, 11),
            "reference_hf_1": time_reference_target_forward(target, prompt, 1, 11),
            "engine_graph_verify_16": time_graph_ms(engine.runner, 16),
            "engine_graph_verify_1": time_graph_ms(engine.runner, 1),
            "note": "engine graphs include the draft context insert",
        }
        result["decode_vs_bandwidth"] = decode_vs_bandwidth(
            engine.runner, result["block1"]["engine"]["ms_per_step_wall"]
        )
        logger.info("decode: %s", result["decode_vs_bandwidth"])
    del target, draft, engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def decode_vs_bandwidth(runner: ModelRunner, step_ms_wall: float) -> dict[str, float]:
    """Plain decode (k = 0, batch 1) against the time to read the target's weights once."""
    weight_bytes = sum(
        p.numel() * p.element_size()
        for n, p in runner.target.named_parameters()
        if "embed_tokens" not in n
    )
    weight_bytes += sum(  # the fused qkv / gate_up weights live in buffers
        b.numel() * b.element_size()
        for n, b in runner.target.named_buffers()
        if n.endswith(("qkv_weight", "gate_up_weight"))
    )
    bandwidth = hbm_bandwidth_bytes_per_s()
    floor_ms = 1e3 * weight_bytes / bandwidth
    graph_ms = time_graph_ms(runner, 1) or float("nan")
    return {
        "weight_bytes_read": weight_bytes,
        "hbm_bytes_per_s": bandwidth,
        "floor_ms": floor_ms,
        "step_ms_wall": step_ms_wall,
        "graph_ms": graph_ms,
        "ratio_wall": step_ms_wall / floor_ms,
        "ratio_graph": graph_ms / floor_ms,
    }


def section_engine_only(
    shape_name: str, shape: ModelShape, prompt_len: int, new_tokens: int
) -> dict[str, Any]:
    """The engine alone on random weights (no reference models in memory)."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    spec = dflash_draft_for(shape)
    max_seq_len = prompt_len + new_tokens + 8
    target, draft = build_models(shape, spec, device, dtype, max_seq_len + 64)
    runner = ModelRunner(target, draft, device, dtype, 1, max_seq_len, use_cuda_graphs=True)
    engine = Engine(runner, 1, max_seq_len, spec_burst=1)  # timed one step a call
    prompt = torch.randint(0, shape.vocab_size, (prompt_len,)).tolist()
    run_engine(engine, prompt[:64], 8, spec.block_size - 1)  # warm-up
    result: dict[str, Any] = {
        "shape": shape_name,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
    }
    for label, k in (("block16", spec.block_size - 1), ("block1", 0)):
        ours = run_engine(engine, prompt, new_tokens, k)
        result[label] = {
            k_: v for k_, v in ours.items() if k_ not in ("output_ids", "accept_lengths")
        }
    result["graph_ms"] = {
        "verify_16": time_graph_ms(runner, 16),
        "verify_1": time_graph_ms(runner, 1),
    }
    result["decode_vs_bandwidth"] = decode_vs_bandwidth(
        runner, result["block1"]["ms_per_step_wall"]
    )
    logger.info("engine only: %s", json.dumps(result))
    del engine, runner, target, draft
    torch.cuda.empty_cache()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shape, no cost tables")
    parser.add_argument("--skip-cost-tables", action="store_true")
    parser.add_argument(
        "--engine-only",
        action="store_true",
        help="skip the dflash reference; time the engine on random weights",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(sys.argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    name, shape = ("tiny", TINY) if args.smoke else ("qwen3-8b", TARGET_SHAPES["qwen3-8b"])
    report: dict[str, Any] = {
        "command": command,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if not args.smoke else "cpu",
    }
    try:
        if args.engine_only:
            report["engine_only"] = section_engine_only(name, shape, 512, 64)
        else:
            report["reference"] = section_reference(
                name, shape, device, dtype, 128 if args.smoke else 512, 16 if args.smoke else 64
            )
    except Exception as exc:  # keep going: the cost tables are still worth having
        logger.exception("reference section failed")
        report["reference_error"] = repr(exc)
    (args.out_dir / "engine_gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.smoke or args.skip_cost_tables:
        return 0
    for table_name in ("qwen3-8b", "qwen3-32b"):
        started = time.perf_counter()
        batch_sizes, tokens = [1, 2, 4, 8, 16, 32, 64, 128], [1, 2, 4, 8, 16]
        table = measure_cost_table(TARGET_SHAPES[table_name], 1024, batch_sizes, tokens, 20)
        doc = cost_table_document(
            table_name,
            torch.cuda.get_device_name(),
            1024,
            batch_sizes,
            tokens,
            table,
            command + f"  # cost table {table_name}",
        )
        (args.out_dir / f"{table_name}-h200.json").write_text(json.dumps(doc, indent=2) + "\n")
        logger.info("%s table in %.0f s", table_name, time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
