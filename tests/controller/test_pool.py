"""PoolBackend on its own: in-flight accounting and upstream connections are always released."""

from __future__ import annotations

from typing import Any

from engines.base import BackendRequest, Outcome
from engines.config import PoolConfig
from engines.pool import PoolBackend
from policies.types import Task
from tests.controller.conftest import MODEL, StartUpstream

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _annotate(outcome: Outcome) -> dict[str, Any]:
    return {}


async def test_stream_closed_before_it_ran_releases_slot(start_upstream: StartUpstream) -> None:
    upstream = await start_upstream(num_chunks=50, chunk_delay_s=0.02)
    pool = PoolBackend(
        PoolConfig(name="p", kind="vllm", urls=[upstream.url], model=MODEL, spec_tokens=7)
    )
    await pool.start()
    try:
        request = BackendRequest("chat", BODY, True, Task.CHAT, "1")
        response = await pool.submit(request, 7, _annotate)
        assert pool.num_inflight() == 1
        await response.body.aclose()  # type: ignore[attr-defined]  # never iterated
        assert response.release is not None
        response.release()
        response.release()  # idempotent
        assert pool.num_inflight() == 0
        # A normal stream releases by itself when it ends.
        response = await pool.submit(request, 7, _annotate)
        chunks = [c async for c in response.body]
        assert chunks[-1].endswith(b"data: [DONE]\n\n")
        assert pool.num_inflight() == 0 and response.error is None
        assert pool.slots[0].is_healthy
    finally:
        await pool.close()
