"""A two-pool layout as ``draftctl plan`` writes it, served by a second draftctl gateway in
front of the session's real vLLM servers: each task reaches its planned pool.

The layout: math and code on the k = 7 server, chat on the no-speculation server (the plan's
config and static policy, ``sim/plan_outputs.py``); only the URLs are the session's, since the
plan numbers ports from ``--base-port``. Marginal cost: one gateway start and three requests.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.cli import main
from sim.fleet_plan import task_homes
from sim.plan_outputs import Servers, config_yaml, policy_yaml, server_urls
from tests.integration.gateway_client import chat_args, client
from tests.integration.processes import free_port, start, wait_ready
from tests.integration.stack import (
    BLOCK_SIZE,
    GATEWAY_START_TIMEOUT_S,
    MODEL,
    REPO_ROOT,
    Fleet,
    Gateway,
    K,
    scrape,
)

pytestmark = pytest.mark.vllm

LAYOUT = {
    "pools": {
        "math-code": {"instances": 1, "tasks": ["math", "code"], "num_speculative_tokens": K},
        "chat": {"instances": 1, "tasks": ["chat"], "num_speculative_tokens": 0},
    }
}


# One pool, every task on the k = 7 server, for the recorded trace below (every request drafts).
ONE_POOL = {"pools": {"all": {"instances": 1, "tasks": [], "num_speculative_tokens": K}}}


def _write_plan_files(
    directory: Path, fleet: Fleet, port: int, layout: dict[str, Any] = LAYOUT, extra: str = ""
) -> Path:
    servers = Servers(MODEL, str(fleet.target_dir), str(fleet.draft_dir), block_size=BLOCK_SIZE)
    text = config_yaml(layout, servers)
    planned = server_urls(layout, servers)
    urls = {"math-code": fleet.k7_url, "chat": fleet.nospec_url, "all": fleet.k7_url}
    for pool in layout["pools"]:
        text = text.replace(planned[pool][0], urls[pool])
    text += f"server:\n  host: 127.0.0.1\n  port: {port}\n  drain_grace_s: 0\n{extra}"
    (directory / "policy.yaml").write_text(policy_yaml(layout, task_homes(layout)))
    path = directory / "config.yaml"
    path.write_text(text)
    return path


def _gateway(
    fleet: Fleet, directory: Path, layout: dict[str, Any] = LAYOUT, extra: str = ""
) -> Iterator[Gateway]:
    port = free_port()
    config = _write_plan_files(directory, fleet, port, layout, extra)
    argv = [sys.executable, "-m", "controller.cli", "serve", "--config", str(config)]
    process = start("draftctl-planned", argv, directory, {"PYTHONPATH": str(REPO_ROOT)})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready([(process, f"{url}/healthz")], GATEWAY_START_TIMEOUT_S)
        yield Gateway(url, process, fleet.k7_url, scrape(fleet.k7_url))
    finally:
        process.stop()


@pytest.fixture(scope="module")
def planned(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    yield from _gateway(fleet, tmp_path_factory.mktemp("planned-gateway"))


@pytest.mark.parametrize(
    ("task", "pool"), [("math", "math-code"), ("code", "math-code"), ("chat", "chat")]
)
def test_each_task_reaches_its_planned_pool(planned: Gateway, task: str, pool: str) -> None:
    raw = client(planned).chat.completions.with_raw_response.create(**chat_args(task))
    headers = dict(raw.headers)
    assert headers["x-draftctl-backend"] == pool
    want_k = LAYOUT["pools"][pool]["num_speculative_tokens"]
    assert headers["x-draftctl-spec-tokens"] == str(want_k)
    assert raw.parse().usage.completion_tokens == 16


def test_a_plan_from_the_trace_a_gateway_recorded_in_front_of_vllm(
    fleet: Fleet, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A gateway with recording on in front of the real k = 7 vLLM server (its per-request
    spec-decode metrics at ``summary`` level: counts, no per-step detail) serves math, code and
    chat; ``draftctl plan --traffic-log`` plans a fleet from that trace: every request drafted,
    so every task has acceptance to draw from, and the plan is made (its traffic.yaml too)."""
    directory = tmp_path_factory.mktemp("recorded-gateway")
    trace = directory / "served.jsonl"
    recording = f"recording:\n  enabled: true\n  path: {trace}\n"
    gateway = _gateway(fleet, directory, ONE_POOL, recording)
    served = next(gateway)
    try:
        for task in ("math", "code", "chat") * 2:
            client(served).chat.completions.create(**chat_args(task))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the recorder writes off the event loop
            lines = trace.read_text().splitlines() if trace.exists() else []
            if sum('"type":"request"' in line for line in lines) >= 6:
                break
            time.sleep(0.2)
    finally:
        gateway.close()
    out = directory / "plan"
    table = REPO_ROOT / "cost_tables" / "qwen3-8b-h200.json"
    argv = ["plan", "--traffic-log", str(trace), "--instances", "2", "--cost-table", str(table),
            "--loop", "closed", "--out-dir", str(out), "--json", "--no-progress",
            "--search-scale", "0.5"]  # fmt: skip
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    tasks = plan["traffic_log"]["tasks"]
    assert {t: (v["requests"], v["drafted_requests"]) for t, v in tasks.items()} == {
        "math": (2, 2), "code": (2, 2), "chat": (2, 2)
    }  # fmt: skip
    # one client sending each request when the last is answered: a closed loop (said, since
    # six quick requests are too few for auto to tell from timing)
    assert plan["traffic_log"]["loop"] == "closed" and plan["objective"] == "goodput"
    assert plan["recommended"] in plan["full_length"]
    assert (out / "traffic.yaml").is_file() and (out / "launch-vllm.sh").is_file()
