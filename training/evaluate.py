"""Stage 4: acceptance per task on held-out prompts through the `dflash` reference loop (CPU).

For every prompt: greedy speculative decoding with k = block_size - 1 (dflash_generate), and
plain greedy decoding of the target alone (dflash_generate with block_size=1) to check that the
outputs are identical (speculation is lossless) and to time both. Writes the bench JSON
(bench/results/pair_<name>.json) and per-request traces (traces/<name>_b<B>.jsonl).
"""

import json
import logging
import platform
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from training.chat import ENDOFTEXT, IM_END
from training.prompts import TASK_SOURCES, all_sources, load_prompts, task_of

log = logging.getLogger(__name__)


def load_pair(target_dir: Path, draft_dir: Path, device: str = "cpu"):
    import dflash.model as dflash_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not str(device).startswith("cuda"):
        dflash_model._cuda_time = time.perf_counter  # the reference times with CUDA syncs only
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    target = target.to(torch.device(device)).eval()  # type: ignore[arg-type]
    draft = dflash_model.DFlashDraftModel.from_pretrained(draft_dir, dtype=torch.float32)
    draft = draft.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    return target, draft, tokenizer


def run_one(target, draft, input_ids, max_new_tokens: int, stop_ids: list[int], block_size: int):
    from dflash.model import dflash_generate

    start = time.perf_counter()
    out = dflash_generate(
        draft, target, input_ids, max_new_tokens, stop_ids, block_size=block_size, return_stats=True
    )
    elapsed = time.perf_counter() - start
    return out.output_ids[0, input_ids.shape[1] :].tolist(), out.acceptance_lengths, elapsed


def evaluate_pair(args, pair_dir: Path) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)  # 1 thread: steadier on a shared 2-core machine
    draft_dir = args.draft or pair_dir / "draft"
    target, draft, tokenizer = load_pair(pair_dir / "target", draft_dir, args.device)
    block_size = args.block_size or draft.block_size
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in (IM_END, ENDOFTEXT)]
    per_source, traces = {}, []
    for source in args.sources or all_sources():
        rows = _evaluate_source(source, target, draft, tokenizer, args, block_size, stop_ids)
        per_source[source] = _summary(rows)
        traces += [
            {
                "task": task_of(source),
                "source": source,
                "block_size": block_size,
                "accept_lengths": r["accept_lengths"],
            }
            for r in rows
        ]
        log.info("%s: %s", source, per_source[source])
    result = _result(args, pair_dir, draft_dir, block_size, per_source)
    _write(args, result, traces, block_size)
    return result


def _evaluate_source(source, target, draft, tokenizer, args, block_size, stop_ids) -> list[dict]:
    rows = []
    for text in tqdm(
        load_prompts(source, args.data, args.prompts_per_task, args.prompts_file), desc=source
    ):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"].to(target.device)
        spec, accept, spec_s = run_one(
            target, draft, ids, args.max_new_tokens, stop_ids, block_size
        )
        plain, plain_s = None, 0.0
        if not args.no_baseline:
            plain, _, plain_s = run_one(target, draft, ids, args.max_new_tokens, stop_ids, 1)
        rows.append(
            {
                "accept_lengths": accept,
                "tokens": len(spec),
                "identical": None if plain is None else spec == plain,
                "spec_s": spec_s,
                "plain_s": plain_s,
                "prompt_tokens": ids.shape[1],
            }
        )
    return rows


def _summary(rows: list[dict]) -> dict:
    steps = [a for r in rows for a in r["accept_lengths"]]
    tokens = sum(r["tokens"] for r in rows)
    spec_s, plain_s = sum(r["spec_s"] for r in rows), sum(r["plain_s"] for r in rows)
    return {
        "num_prompts": len(rows),
        "num_steps": len(steps),
        "output_tokens": tokens,
        "mean_accept_length": round(statistics.fmean(steps), 3) if steps else None,
        "identical_outputs": sum(bool(r["identical"]) for r in rows),
        "checked_outputs": sum(r["identical"] is not None for r in rows),
        "spec_tokens_per_s": round(tokens / spec_s, 1) if spec_s else None,
        "target_only_tokens_per_s": round(tokens / plain_s, 1) if plain_s else None,
        "mean_prompt_tokens": round(statistics.fmean(r["prompt_tokens"] for r in rows), 1),
    }


def _result(args, pair_dir, draft_dir, block_size, per_source) -> dict:
    per_task = {}
    for task, names in TASK_SOURCES.items():
        chosen = [per_source[n] for n in names if n in per_source and per_source[n]["num_steps"]]
        steps = sum(s["num_steps"] for s in chosen)
        if steps:
            accepted = sum(s["mean_accept_length"] * s["num_steps"] for s in chosen)
            per_task[task] = round(accepted / steps, 3)
    return {
        "pair": str(pair_dir),
        "draft": str(draft_dir),
        "block_size": block_size,
        "spec_tokens": block_size - 1,
        "decoding": "greedy",
        "engine": "dflash reference (dflash_generate, batch 1)",
        "max_new_tokens": args.max_new_tokens,
        "prompts_per_source": args.prompts_per_task,
        "machine": _machine(args.device),
        "mean_accept_length_per_task": per_task,
        "per_source": per_source,
    }


def _machine(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}"


def _write(args, result, traces, block_size) -> None:
    name = Path(result["pair"]).name
    results = args.results or Path("bench/results") / f"pair_{name}_b{block_size}.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=2) + "\n")
    trace_path = args.traces or Path("traces") / f"{name}_b{block_size}.jsonl"
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    trace_path.write_text("".join(json.dumps(t) + "\n" for t in traces))
