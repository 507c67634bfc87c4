"""``draftctl generate``: run prompts through the embedded DFlash engine at a fixed k.

Per prompt it prints the text, token ids, per-step accept lengths (bonus token included) and
their mean; ``--json`` prints one JSON object per prompt instead. Text prompts go through the
target's chat template; a JSONL line may hold ``prompt`` (text), ``messages`` (chat) or
``prompt_ids`` (token ids, used as is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from engines.embedded.events import (
    ATTENTION_CHOICES,
    COMPILE_MODES,
    COMPILE_SCOPES,
    VERIFY_MODES,
)
from policies.types import max_spec_tokens

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate with the embedded DFlash engine and print accept lengths",
        description="Generate with the embedded engine (target + DFlash draft directories).",
    )
    parser.add_argument("--target", type=Path, required=True, help="target HF model directory")
    parser.add_argument("--draft", type=Path, required=True, help="DFlash draft directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="one user message (chat template applied)")
    source.add_argument("--jsonl", type=Path, help="file of {prompt|messages|prompt_ids} lines")
    parser.add_argument("--spec-tokens", type=int, help="k per step (default: block size - 1)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, help="sampling seed")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--max-batch-size", type=int, default=8, help="rows decoded together")
    parser.add_argument(
        "--max-seq-len", type=int, default=2048, help="prompt + output tokens per request"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the forwards first (faster steps on CUDA; slow start-up)",
    )
    parser.add_argument(
        "--compile-scope",
        default="forward",
        choices=COMPILE_SCOPES,
        help="with --compile: each forward whole, or the target's layer step once for all "
        "layers (regional: start-up does not grow with depth)",
    )
    parser.add_argument(
        "--compile-mode",
        default="default",
        choices=COMPILE_MODES,
        help="with --compile: inductor's default; max-autotune (kernel choices, GEMMs "
        "included, benchmarked per shape at start-up); or coordinate-descent (only inductor's "
        "own kernels' launch configurations tuned)",
    )
    parser.add_argument(
        "--compile-cache-dir",
        type=Path,
        default=Path(".draftctl/compile-cache"),
        help="with --compile: inductor's and Triton's on-disk caches, so the next run reads "
        "what this one compiled (TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR set in the "
        "environment win; default: %(default)s)",
    )
    parser.add_argument(
        "--verify-mode",
        default="ragged",
        choices=VERIFY_MODES,
        help="CUDA-graph verifies packed to the tokens rows use (default), or padded to the "
        "widest k",
    )
    parser.add_argument(
        "--attention",
        default="auto",
        choices=ATTENTION_CHOICES,
        help="the target's attention kernel: SDPA with a dense mask, or a split-KV Triton "
        "kernel reading only the keys each row uses (CUDA only); auto (default): triton on "
        "CUDA where its start-up check passes, else SDPA",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per prompt")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engines.embedded.checkpoint import CheckpointError

    if args.compile_scope != "forward" and not args.compile:
        logger.error("generate: --compile-scope %s only applies with --compile", args.compile_scope)
        return 2
    if args.compile_mode != "default" and not args.compile:
        logger.error("generate: --compile-mode %s only applies with --compile", args.compile_mode)
        return 2
    if args.attention == "triton" and args.device == "cpu":
        logger.error("generate: --attention triton runs on CUDA; use --attention sdpa on cpu")
        return 2
    try:
        prompts = _read_prompts(args)
        results = asyncio.run(_generate_all(args, prompts))
    except (CheckpointError, ValueError, OSError) as exc:
        logger.error("generate: %s", exc)
        return 2
    for result in results:
        sys.stdout.write(_format(result, args.json))
    return 0


def _read_prompts(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.prompt is not None:
        return [{"prompt": args.prompt}]
    prompts = []
    for number, line in enumerate(args.jsonl.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{args.jsonl}:{number}: invalid JSON ({exc.msg})") from exc
        if not isinstance(item, dict) or not {"prompt", "messages", "prompt_ids"} & set(item):
            raise ValueError(
                f"{args.jsonl}:{number}: expected an object with prompt, messages or prompt_ids"
            )
        prompts.append(item)
    if not prompts:
        raise ValueError(f"{args.jsonl}: no prompts")
    return prompts


def _prompt_ids(tokenizer: Any, item: dict[str, Any]) -> list[int]:
    if "prompt_ids" in item:
        return [int(t) for t in item["prompt_ids"]]
    messages = item.get("messages") or [{"role": "user", "content": item["prompt"]}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(t) for t in ids]


def _stop_token_ids(tokenizer: Any, target: Path) -> tuple[int, ...]:
    stops = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    generation = target / "generation_config.json"
    if generation.is_file():
        eos = json.loads(generation.read_text()).get("eos_token_id")
        stops.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return tuple(sorted(stops))


async def _generate_all(args: argparse.Namespace, items: list[dict[str, Any]]) -> list[dict]:
    from engines.embedded import AsyncEngine, SamplingParams
    from engines.embedded.compile_cache import use_compile_cache

    if args.compile:
        use_compile_cache(args.compile_cache_dir)
    engine = AsyncEngine.load(
        args.target,
        args.draft,
        device=args.device,
        max_batch_size=args.max_batch_size,
        max_seq_len=args.max_seq_len,
        compile_forwards=args.compile,
        compile_scope=args.compile_scope,
        compile_mode=args.compile_mode,
        verify_mode=args.verify_mode,
        attention=args.attention,
    )
    ceiling = max_spec_tokens(engine.block_size)
    k = ceiling if args.spec_tokens is None else args.spec_tokens
    if not 0 <= k <= ceiling:
        await engine.close()
        raise ValueError(f"--spec-tokens {k}: must be in 0..{ceiling}")
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop_token_ids=_stop_token_ids(engine.tokenizer, args.target),
    )

    async def one(item: dict[str, Any]) -> dict[str, Any]:
        token_ids: list[int] = []
        accept_lengths: list[int] = []
        first_token_at = time.perf_counter()
        prompt_ids = _prompt_ids(engine.tokenizer, item)
        async for event in engine.generate(prompt_ids, params, lambda view: k):
            if not token_ids:
                first_token_at = time.perf_counter()
            token_ids.extend(event.token_ids)
            if event.report is not None:
                accept_lengths.append(event.report.accept_length)
        decode_s = time.perf_counter() - first_token_at
        mean = sum(accept_lengths) / len(accept_lengths) if accept_lengths else None
        return {
            "text": engine.tokenizer.decode(token_ids, skip_special_tokens=True),
            "token_ids": token_ids,
            "accept_lengths": accept_lengths,
            "mean_accept_length": mean,
            "spec_tokens": k,
            # Tokens after the first over the wall time after it (shared with other prompts).
            "decode_tokens_per_s": (len(token_ids) - 1) / decode_s if decode_s > 0 else None,
        }

    try:
        return list(await asyncio.gather(*(one(item) for item in items)))
    finally:
        await engine.close()


def _format(result: dict[str, Any], as_json: bool) -> str:
    if as_json:
        return json.dumps(result) + "\n"
    mean = result["mean_accept_length"]
    return (
        f"text: {result['text']!r}\ntoken_ids: {result['token_ids']}\n"
        f"accept_lengths: {result['accept_lengths']}\n"
        f"mean_accept_length: {'n/a' if mean is None else f'{mean:.3f}'}\n"
        f"decode_tokens_per_s: {result['decode_tokens_per_s'] or 0:.1f}\n\n"
    )
