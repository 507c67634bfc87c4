"""Slow, silent and malformed HTTP clients against a real daemon: each slow one gets a 408 in
the OpenAI shape and its connection closed within the read timeouts (0.5 s here), idle
keep-alive connections are closed, bytes that are not HTTP get an OpenAI-shaped 400, and
well-formed requests sent meanwhile are served as usual."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.robustness.client import Sent, exchange, session
from tests.robustness.conftest import PoolStack
from tests.robustness.daemon import MODEL
from tests.robustness.report import record
from tests.robustness.verdict import openai_error

pytestmark = pytest.mark.slow

BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
WHOLE_HEAD = HEAD + b"content-length: %d\r\n\r\n" % len(BODY)
NUM_PER_KIND = 10
SLOW = {
    "silent": (b"", "header"),  # connects, sends nothing
    "half_head": (HEAD, "header"),
    "half_body": (WHOLE_HEAD + BODY[:10], "body"),
}


async def slow_client(port: int, sent: bytes, trickle: bool) -> tuple[bytes, float]:
    """Send ``sent`` (a byte every 0.1 s when ``trickle``); return what came back by the time
    the server closed the connection, and when."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()

    async def send() -> None:
        for i in range(0, len(sent), 1 if trickle else len(sent) or 1):
            writer.write(sent[i : i + (1 if trickle else len(sent))])
            await asyncio.sleep(0.1)

    sending = asyncio.create_task(send())
    try:
        answer = await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        answer = b"<reset>"
    finally:
        sending.cancel()
        writer.close()
    return answer, time.monotonic() - started


def assert_408(answer: bytes, phase: str) -> None:
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    error = openai_error(answer.split(b"\r\n\r\n", 1)[1])
    assert error is not None and error["code"] == "request_timeout", answer
    assert f"server.{phase}_timeout_s = 0.5" in error["message"]


async def test_slow_clients_get_408_and_others_are_served(pools: PoolStack) -> None:
    port = int(pools.daemon.url.rsplit(":", 1)[1])
    slow = [
        (phase, slow_client(port, sent, trickle=False))
        for sent, phase in SLOW.values()
        for _ in range(NUM_PER_KIND)
    ]
    trickled = [("header", slow_client(port, WHOLE_HEAD, trickle=True)) for _ in range(3)]
    normal = Sent("POST", "/v1/chat/completions", BODY, {"content-type": "application/json"})
    async with session() as http:
        answers, served = await asyncio.gather(
            asyncio.gather(*(coro for _, coro in [*slow, *trickled])),
            asyncio.gather(*(exchange(http, pools.daemon.url, normal, 10) for _ in range(20))),
        )
    for (phase, _), (answer, elapsed_s) in zip([*slow, *trickled], answers, strict=True):
        assert_408(answer, phase)
        assert elapsed_s < 3, elapsed_s
    assert [a.status for a in served] == [200] * 20
    # A keep-alive connection idle after its answer is closed without a word.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(WHOLE_HEAD + BODY)
    idle_answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert idle_answer.startswith(b"HTTP/1.1 200 ") and idle_answer.endswith(b"}")
    settled = await asyncio.to_thread(pools.daemon.wait_settled)
    assert settled == (0.0, 0) and pools.daemon.readyz() == 200
    record(
        "slow_clients",
        {
            "slow_connections": len(answers),
            "answered_408": len(answers),
            "max_close_s": round(max(e for _, e in answers), 2),
            "served_meanwhile": len(served),
        },
    )


NOT_HTTP = [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nno colon here\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v1/\x00completions HTTP/1.1\r\nhost: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello on the plain port
]


@pytest.mark.parametrize("sent", NOT_HTTP)
async def test_bytes_that_are_not_http_get_an_openai_400(pools: PoolStack, sent: bytes) -> None:
    """uvicorn answered these with a plain-text 400 ("Invalid HTTP request received.")."""
    port = int(pools.daemon.url.rsplit(":", 1)[1])
    answer, _ = await slow_client(port, sent, trickle=False)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    error = openai_error(answer.split(b"\r\n\r\n", 1)[1])
    assert error is not None and error["code"] == "invalid_http", answer


CONTROL_IN_HEADERS = [
    b"GET /admin/policy/versions HTTP/1.1\r\nhost: x\r\nauthorization: \x7f\r\n\r\n",
    b"GET /admin/policy/versions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer \x01\x7f\xff\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-draftctl-task: ma\x7fth\r\n"
    b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY) + BODY,
]


@pytest.mark.parametrize("sent", CONTROL_IN_HEADERS)
async def test_control_characters_in_a_header_get_an_openai_4xx(
    pools: PoolStack, sent: bytes
) -> None:
    """What the HTTP client library refuses to send (the fuzzer cannot draw it): DEL and other
    control bytes in a header value are answered with an OpenAI-shaped 4xx, never a 5xx."""
    port = int(pools.daemon.url.rsplit(":", 1)[1])
    answer, _ = await slow_client(port, sent, trickle=False)
    status = int(answer.split(b" ", 2)[1])
    assert 400 <= status < 500, answer[:300]
    error = openai_error(answer.split(b"\r\n\r\n", 1)[1].split(b"\r\n0\r\n")[0])
    assert error is not None and error["message"], answer
