"""The pieces of the real-vLLM test stack: constants, server command lines, config files."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from engines.prometheus_text import ScrapeSample
from engines.stats_window import parse_prometheus
from tests.integration.processes import Process

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON_ENV = "DRAFTCTL_VLLM_PYTHON"
MODEL = "tiny"
K = 7
BLOCK_SIZE = 8
# Token 'a' (byte 0x61) is favoured by both target and draft: greedy decoding accepts every
# draft (accept length 8), sampled decoding at temperature 1 accepts almost none.
BIAS_TOKEN_ID = 0x61
SERVER_START_TIMEOUT_S = 420.0
GATEWAY_START_TIMEOUT_S = 60.0
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB per server
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # two servers share 2 cores; don't pin both to one
    "VLLM_LOGGING_LEVEL": "INFO",
}


@dataclass
class Fleet:
    target_dir: Path
    draft_dir: Path
    k7: Process
    nospec: Process
    k7_url: str
    nospec_url: str
    startup_s: float


@dataclass
class Gateway:
    url: str
    process: Process
    k7_url: str
    # vLLM k7's counters when the gateway started: all later k7 traffic goes through it.
    k7_baseline: ScrapeSample


def vllm_python() -> str:
    python = os.environ.get(VLLM_PYTHON_ENV, "")
    if not os.access(python, os.X_OK):
        raise RuntimeError(f"{VLLM_PYTHON_ENV}={python!r} is not an executable Python")
    return python


def vllm_argv(python: str, port: int, target: Path, *extra: str) -> list[str]:
    return [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--host", "127.0.0.1", "--port", str(port),
        "--model", str(target), "--served-model-name", MODEL,
        "--max-model-len", "512", "--dtype", "float32", "--enforce-eager",
        "--max-num-seqs", "16", "--seed", "0",
        *extra,
    ]  # fmt: skip


def scrape(server_url: str) -> ScrapeSample:
    with urllib.request.urlopen(f"{server_url}/metrics", timeout=10) as response:
        return parse_prometheus(response.read().decode(), time.monotonic())


def write_gateway_files(directory: Path, fleet: Fleet, port: int) -> Path:
    """A draftctl config for the two pools and a static policy that separates them.

    Policy: one request alone is band 0, two or more concurrent requests band 1; chat gets
    k = 7 alone and drafting off under load, math and code always k = 7.
    """
    pool = {"model": MODEL, "block_size": BLOCK_SIZE, "health_interval_s": 0.5, "timeout_s": 120}
    config = {
        "server": {"host": "127.0.0.1", "port": port, "drain_timeout_s": 5, "drain_grace_s": 0},
        "policy": {"path": "policy.yaml", "versions_dir": "policy-versions"},
        "stats": {"window_s": 600, "scrape_interval_s": 0.5},
        "backends": [
            {"name": "vllm-k7", "kind": "vllm", "urls": [fleet.k7_url], "spec_tokens": K, **pool},
            {"name": "vllm-nospec", "kind": "vllm", "urls": [fleet.nospec_url], "spec_tokens": 0,
             **pool},
        ],
    }  # fmt: skip
    policy = (
        "kind: static\n"
        "min_spec_tokens: 4\n"
        "static:\n"
        "  concurrency_bands: [1]\n"
        "  spec_tokens:\n"
        "    math: [7, 7]\n"
        "    code: [7, 7]\n"
        "    chat: [7, 0]\n"
    )
    (directory / "policy.yaml").write_text(policy)
    config_path = directory / "draftctl.yaml"
    config_path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return config_path
