"""Long requests on the real daemon (embedded demo pair, 1024-token context): a whole request
whose client leaves stops generating at once, and SIGTERM with open streams gives every
stream a clean end (``[DONE]``) or an SSE error event saying the drain cut it, a whole request
still running a 503 ``shutting_down``; nothing is cut silently, and the process exits 0. During
``drain_grace_s`` after the SIGTERM, ``/readyz`` answers 503 and new requests are still served;
then new connections are refused.

A greedy "Tell me a long story." runs to max_tokens on the demo pair (it reached 480 tokens
without an end-of-text): 900 tokens are seconds of decoding here, however fast a step is
(session 36, this 2-core CPU: 2.6-3.5 s alone, 3.9-5.6 s for four at once; the drain cuts
the streams 2.5 s after the SIGTERM; with a 2 s drain, 3.5 s after it, a stream finished once
in CI).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator

import aiohttp
import pytest

from tests.robustness.client import Answer, Sent, exchange, session
from tests.robustness.daemon import MODEL, Daemon, embedded_backend, start_daemon
from tests.robustness.verdict import openai_error, sse_events, stream_problem

pytestmark = pytest.mark.slow

DRAIN_TIMEOUT_S = 1.0
DRAIN_GRACE_S = 1.5
LONG = 900  # tokens: never done within the drain


@pytest.fixture(scope="module")
def long_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    pytest.importorskip("torch")
    directory = tmp_path_factory.mktemp("long-requests")
    backends = [embedded_backend(max_seq_len=1024)]
    daemon = start_daemon(
        directory,
        backends,
        drain_timeout_s=DRAIN_TIMEOUT_S,
        drain_grace_s=DRAIN_GRACE_S,
        name="long",
    )
    try:
        yield daemon
    finally:
        daemon.stop()


def request(max_tokens: int, is_stream: bool) -> Sent:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": is_stream,
    }
    return Sent("POST", "/v1/chat/completions", json.dumps(body).encode())


async def test_a_whole_request_whose_client_left_stops_generating(long_daemon: Daemon) -> None:
    async with session() as http:
        answer = await exchange(http, long_daemon.url, request(LONG, False), 60, leave_after_s=0.5)
    assert answer.is_left
    left_at = time.monotonic()
    while long_daemon.inflight()[0] != 0.0:
        assert time.monotonic() - left_at < 1.5, "the engine kept generating for nobody"
        await asyncio.sleep(0.05)
    assert await asyncio.to_thread(long_daemon.wait_settled) == (0.0, 0)


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
    long_daemon: Daemon,
) -> None:
    """Runs last in this module: it stops the daemon."""
    async with session() as http:
        sents = [request(n, True) for n in (8, 8, LONG, LONG, LONG)]
        streams = [await open_stream(http, long_daemon.url, s) for s in sents]
        whole = asyncio.create_task(exchange(http, long_daemon.url, request(LONG, False), 30))
        await asyncio.sleep(0.2)  # the whole request is being decoded
        signalled = time.monotonic()
        long_daemon.process.kill(signal.SIGTERM)
        await asyncio.sleep(0.2)
        # The grace: not ready, yet still listening and serving new requests.
        ready = await exchange(http, long_daemon.url, Sent("GET", "/readyz", b""), 5)
        late = await exchange(http, long_daemon.url, request(4, False), 5)
        in_grace_s = time.monotonic() - signalled
        bodies = await asyncio.wait_for(
            asyncio.gather(*streams), DRAIN_GRACE_S + DRAIN_TIMEOUT_S + 10
        )
        whole_answer: Answer = await whole
        after = await exchange(http, long_daemon.url, Sent("GET", "/readyz", b""), 5)
    ended_s = time.monotonic() - signalled
    returncode = await asyncio.to_thread(long_daemon.process.popen.wait, 20)
    assert in_grace_s < DRAIN_GRACE_S, "the checks below ran after the grace: inconclusive"
    assert ready.status == 503 and json.loads(ready.body)["draining"] is True, ready
    assert late.status == 200 and json.loads(late.body)["choices"], late
    assert after.status is None, after  # listener closed once the grace was over
    assert [outcome(b) for b in bodies] == ["done"] * 2 + ["shutting_down"] * 3
    error = openai_error(whole_answer.body)
    assert whole_answer.status == 503 and error is not None, whole_answer
    assert error["code"] == "shutting_down"
    assert ended_s < DRAIN_GRACE_S + DRAIN_TIMEOUT_S + 5
    assert returncode == 0
