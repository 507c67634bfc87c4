"""A two-pool layout as ``draftctl plan`` writes it, served by a second draftctl gateway in
front of the session's real vLLM servers: each task reaches its planned pool.

The layout: math and code on the k = 7 server, chat on the no-speculation server (the plan's
config and static policy, ``sim/plan_outputs.py``); only the URLs are the session's, since the
plan numbers ports from ``--base-port``. Marginal cost: one gateway start and three requests.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def _write_plan_files(directory: Path, fleet: Fleet, port: int) -> Path:
    servers = Servers(MODEL, str(fleet.target_dir), str(fleet.draft_dir), block_size=BLOCK_SIZE)
    text = config_yaml(LAYOUT, servers)
    planned = server_urls(LAYOUT, servers)
    for pool, url in (("math-code", fleet.k7_url), ("chat", fleet.nospec_url)):
        text = text.replace(planned[pool][0], url)
    text += f"server:\n  host: 127.0.0.1\n  port: {port}\n  drain_grace_s: 0\n"
    (directory / "policy.yaml").write_text(policy_yaml(LAYOUT, task_homes(LAYOUT)))
    path = directory / "config.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def planned(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("planned-gateway")
    port = free_port()
    config = _write_plan_files(directory, fleet, port)
    argv = [sys.executable, "-m", "controller.cli", "serve", "--config", str(config)]
    process = start("draftctl-planned", argv, directory, {"PYTHONPATH": str(REPO_ROOT)})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready([(process, f"{url}/healthz")], GATEWAY_START_TIMEOUT_S)
        yield Gateway(url, process, fleet.k7_url, scrape(fleet.k7_url))
    finally:
        process.stop()


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
