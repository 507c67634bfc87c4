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


def _pool(url: str, **settings: Any) -> PoolBackend:
    # A long interval: the checks below are made by hand, not by the pool's loop.
    return PoolBackend(
        PoolConfig(
            name="p", kind="vllm", urls=[url], model=MODEL, spec_tokens=7,
            health_interval_s=3600, **settings,
        )
    )  # fmt: skip


async def test_a_serving_server_is_taken_out_after_failed_checks_in_a_row(
    start_upstream: StartUpstream,
) -> None:
    """One failed or slow health check does not take a serving server out (a busy vLLM can
    answer /health late); ``unhealthy_after`` in a row do; one passing check puts it back."""
    upstream = await start_upstream()
    pool = _pool(upstream.url, unhealthy_after=3, health_timeout_s=0.3)
    await pool.start()
    try:
        assert pool.is_healthy()
        upstream.behaviour.health_delay_s = 1.0  # slower than health_timeout_s: a failure
        await pool.check_health()
        upstream.behaviour.health_delay_s = 0.0
        upstream.behaviour.is_healthy = False
        await pool.check_health()
        assert pool.is_healthy() and pool.slots[0].failed_checks == 2
        await pool.check_health()
        assert not pool.is_healthy()
        upstream.behaviour.is_healthy = True
        await pool.check_health()
        assert pool.is_healthy() and pool.slots[0].failed_checks == 0
        upstream.behaviour.is_healthy = False  # the count starts again after a pass
        await pool.check_health()
        assert pool.is_healthy()
    finally:
        await pool.close()


async def test_the_start_up_check_decides_at_once(start_upstream: StartUpstream) -> None:
    upstream = await start_upstream(is_healthy=False)
    pool = _pool(upstream.url)
    await pool.start()
    try:
        assert not pool.is_healthy()
        upstream.behaviour.is_healthy = True
        await pool.check_health()
        assert pool.is_healthy()
    finally:
        await pool.close()
