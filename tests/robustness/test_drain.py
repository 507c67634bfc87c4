"""SIGTERM with open streams on the real daemon (embedded demo pair): every stream gets a
clean end (``[DONE]``) or an SSE error event saying the drain cut it (short streams end, long
ones are cut); a whole request still running gets a 503 ``shutting_down``; nothing is cut
silently, and the process exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.robustness.client import Answer, Sent, exchange, session
from tests.robustness.daemon import MODEL, embedded_backend, start_daemon
from tests.robustness.verdict import openai_error, sse_events, stream_problem

pytestmark = pytest.mark.slow

DRAIN_TIMEOUT_S = 2.0


def request(max_tokens: int, is_stream: bool) -> Sent:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": is_stream,
    }
    return Sent("POST", "/v1/chat/completions", json.dumps(body).encode())


async def open_stream(http: aiohttp.ClientSession, url: str, sent: Sent) -> asyncio.Task[bytes]:
    """Start a stream and return once its first chunk arrived; the task reads the rest."""
    response = await http.post(url + sent.path, data=sent.body)
    assert response.status == 200
    first = await response.content.readany()

    async def rest() -> bytes:
        try:
            return first + await response.content.read()
        except aiohttp.ClientPayloadError:  # closed without the chunked terminator
            return first + b"<connection cut>"
        finally:
            response.release()

    return asyncio.create_task(rest())


def outcome(body: bytes) -> str:
    """ "done", "shutting_down" (the drain's error event) or what else happened."""
    if stream_problem(body) is None:
        return "done"
    last = sse_events(body)[-1]
    error = openai_error(last.removeprefix(b"data: "))
    return error["code"] if error and error["code"] else f"cut: {last[-120:]!r}"


async def test_sigterm_ends_every_open_stream_cleanly_or_with_an_error_event(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    daemon = start_daemon(
        tmp_path, [embedded_backend()], drain_timeout_s=DRAIN_TIMEOUT_S, name="drain"
    )
    try:
        async with session() as http:
            # Short streams finish within the drain; long ones (140 tokens, ~4 s or more
            # here) cannot; a long whole request waits for its answer meanwhile.
            sents = [request(n, True) for n in (8, 8, 140, 140, 140)]
            streams = [await open_stream(http, daemon.url, s) for s in sents]
            whole = asyncio.create_task(exchange(http, daemon.url, request(140, False), 30))
            await asyncio.sleep(0.2)
            signalled = time.monotonic()
            daemon.process.kill(signal.SIGTERM)
            bodies = await asyncio.wait_for(asyncio.gather(*streams), DRAIN_TIMEOUT_S + 10)
            whole_answer: Answer = await whole
        ended_s = time.monotonic() - signalled
        returncode = await asyncio.to_thread(daemon.process.popen.wait, 20)
    finally:
        daemon.stop()
    outcomes = [outcome(b) for b in bodies]
    assert set(outcomes) == {"done", "shutting_down"}, outcomes
    assert outcomes[:2] == ["done", "done"], outcomes
    if whole_answer.status != 200:  # it may have finished within the drain
        error = openai_error(whole_answer.body)
        assert whole_answer.status == 503 and error is not None, whole_answer
        assert error["code"] == "shutting_down"
    assert ended_s < DRAIN_TIMEOUT_S + 5
    assert returncode == 0
