"""What ``draftctl plan`` writes for a layout: server launch commands and the gateway's files.

The gateway routes a request to the pool whose k its policy picks (``policies.routing``), so a
task-pool layout becomes: one vLLM pool per task pool, each started with its own
``num_speculative_tokens`` (distinct per pool) and schedule, and a static policy that maps
each task to its home pool's k in one concurrency band. Nothing here runs anything.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from policies.types import TASKS, Task


@dataclass(frozen=True)
class Servers:
    """Where the planned servers run and what they load."""

    model: str  # served model name clients address
    target: str  # target model path or id
    draft: str  # DFlash draft path or id
    host: str = "127.0.0.1"
    base_port: int = 8101
    block_size: int = 16
    max_batch_size: int = 128


def server_urls(layout: dict[str, Any], servers: Servers) -> dict[str, list[str]]:
    """pool -> its servers' URLs, ports counted up from ``base_port`` in pool order."""
    urls: dict[str, list[str]] = {}
    port = servers.base_port
    for name, pool in layout["pools"].items():
        urls[name] = [f"http://{servers.host}:{port + i}" for i in range(pool["instances"])]
        port += pool["instances"]
    return urls


def _servers(layout: dict[str, Any], servers: Servers) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(pool name, pool, port) for every planned server."""
    for name, urls in server_urls(layout, servers).items():
        for url in urls:
            yield name, layout["pools"][name], url.rsplit(":", 1)[1]


def vllm_commands(layout: dict[str, Any], servers: Servers) -> list[str]:
    """One ``vllm.entrypoints.openai.api_server`` command line per instance."""
    out = []
    for name, pool, port in _servers(layout, servers):
        args = [
            "python", "-m", "vllm.entrypoints.openai.api_server",
            "--model", servers.target, "--served-model-name", servers.model,
            "--host", servers.host, "--port", port,
            "--max-num-seqs", str(servers.max_batch_size),
        ]  # fmt: skip
        k = pool["num_speculative_tokens"]
        if k > 0:
            spec: dict[str, Any] = {"method": "dflash", "model": servers.draft}
            spec["num_speculative_tokens"] = k
            if "num_speculative_tokens_per_batch_size" in pool:
                spec["num_speculative_tokens_per_batch_size"] = pool[
                    "num_speculative_tokens_per_batch_size"
                ]
            args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
            args += ["--per-request-spec-decode-metrics", "summary"]
        out.append(f"# pool {name}\n" + shlex.join(args))
    return out


def sglang_commands(layout: dict[str, Any], servers: Servers) -> list[str]:
    """SGLang has no batch-size schedule: each pool runs its largest k at every batch size."""
    out = []
    for name, pool, port in _servers(layout, servers):
        args = [
            "python", "-m", "sglang.launch_server",
            "--model-path", servers.target, "--served-model-name", servers.model,
            "--host", servers.host, "--port", port,
            "--max-running-requests", str(servers.max_batch_size),
        ]  # fmt: skip
        k = pool["num_speculative_tokens"]
        if k > 0:
            args += [
                "--speculative-algorithm", "DFLASH",
                "--speculative-draft-model-path", servers.draft,
                "--speculative-num-draft-tokens", str(k + 1),
            ]  # fmt: skip
        out.append(f"# pool {name} (k = {k} at every batch size)\n" + shlex.join(args))
    return out


def config_yaml(layout: dict[str, Any], servers: Servers, kind: str = "vllm") -> str:
    """A draftctl config: the planned pools as ``backends`` and the plan's policy file."""
    lines = [
        "# Written by `draftctl plan`: the planned pools, routed by the static policy in",
        "# policy.yaml (each task to its home pool's k). Check: draftctl config check <this file>",
        "policy:",
        "  path: policy.yaml",
        "backends:",
    ]
    for name, urls in server_urls(layout, servers).items():
        pool = layout["pools"][name]
        tasks = ", ".join(pool["tasks"]) or "every task"
        lines += [
            f"  - name: {name}                 # home of: {tasks}",
            f"    kind: {kind}",
            f"    urls: {json.dumps(urls)}",
            f"    model: {servers.model}",
            f"    spec_tokens: {pool['num_speculative_tokens']}"
            "   # the servers' num_speculative_tokens",
            f"    block_size: {servers.block_size}",
        ]
    return "\n".join(lines) + "\n"


def policy_yaml(
    layout: dict[str, Any], homes: dict[Task, str], spill_margin: int | None = None
) -> str:
    """A static policy sending each task to its home pool's k at every concurrency, with the
    load spill the plan was simulated with."""
    lines = [
        "# Written by `draftctl plan`: each task -> its home pool's k (the gateway routes by k).",
        "kind: static",
        "min_spec_tokens: 1           # keep every pool's k as planned",
        *(
            [f"spill_margin: {spill_margin}       # per-server in-flight gap before spilling"]
            if spill_margin is not None
            else []
        ),
        "static:",
        "  concurrency_bands: []      # one band: routing does not change with load",
        "  spec_tokens:",
    ]
    for task in TASKS:
        k = layout["pools"][homes[task]]["num_speculative_tokens"]
        lines.append(f"    {task.value}: [{k}]       # pool {homes[task]}")
    return "\n".join(lines) + "\n"
