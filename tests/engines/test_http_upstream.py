"""engines/http_upstream.py against real servers on loopback, on asyncio's loop and uvloop.

The aiohttp fake upstream covers the shapes vLLM sends (chunked SSE, Content-Length JSON);
raw socket servers cover what a real server may do to a connection: close it after the
response, drop an idle keep-alive connection, die mid-body, stall, or trickle bytes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from engines.http_upstream import HttpUpstream, UpstreamError, UpstreamTimeout
from tests.controller.fake_upstream import Behaviour, FakeUpstream

LOOPS = pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
CHAT = json.dumps(
    {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True}
).encode()


def run(loop_factory: Callable[[], asyncio.AbstractEventLoop], coro: Awaitable[None]) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


class RawServer:
    """A loopback TCP server; ``handler(reader, writer, connection_number)`` per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.num_connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        try:
            await self.handler(reader, writer, self.num_connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def response(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


async def fake(**behaviour: Any) -> FakeUpstream:
    upstream = FakeUpstream(Behaviour(**behaviour))
    await upstream.start()
    return upstream


@LOOPS
def test_streams_chunked_sse_and_reuses_the_connection(loop_factory: Any) -> None:
    async def main() -> None:
        upstream = await fake(num_chunks=6)
        client = HttpUpstream(upstream.url, 2, 5)
        try:
            for _ in range(3):
                resp = await client.request("POST", "/v1/chat/completions", CHAT)
                assert resp.status == 200
                assert resp.header("Content-Type") == "text/event-stream"
                body = await resp.read_all()
                resp.release()
                events = [e for e in body.split(b"\n\n") if e]
                assert len(events) == 7 and events[-1] == b"data: [DONE]"
                assert json.loads(events[5][6:])["choices"][0]["finish_reason"] == "length"
            assert len(client._idle) == 1  # one keep-alive connection served all three
        finally:
            client.close()
            await upstream.stop()

    run(loop_factory, main())


@LOOPS
def test_content_length_body(loop_factory: Any) -> None:
    async def main() -> None:
        upstream = await fake(num_chunks=4)
        client = HttpUpstream(upstream.url + "/", 2, 5)  # a trailing slash is not doubled
        try:
            body = json.dumps({"model": "demo", "prompt": "x"}).encode()
            resp = await client.request("POST", "/v1/completions", body)
            obj = json.loads(await resp.read_all())
            resp.release()
            assert obj["choices"][0]["text"] == "tok " * 4
            assert upstream.behaviour.received == [{"model": "demo", "prompt": "x"}]
        finally:
            client.close()
            await upstream.stop()

    run(loop_factory, main())


@LOOPS
def test_keep_alive_and_connection_close(loop_factory: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            request = await read_request(reader)
            closing = b"close-me" in request
            writer.write(response(b"hello", *([b"Connection: close"] if closing else [])))
            await writer.drain()
            if closing:
                return

    async def main() -> None:
        server = RawServer(handler)
        async with server as url:
            client = HttpUpstream(url, 2, 5)
            for body in (b"a", b"b", b"close-me", b"c"):
                resp = await client.request("POST", "/x", body)
                assert await resp.read_all() == b"hello"
                resp.release()
            # a and b share a connection; the server closed it after close-me; c needs a new one
            assert server.num_connections == 2
            client.close()

    run(loop_factory, main())


@LOOPS
def test_idle_connection_dropped_by_server_is_retried_on_a_fresh_one(loop_factory: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(response(b"first"))
        await writer.drain()
        await read_request(reader)  # the next request on this connection: drop it unanswered

    async def main() -> None:
        server = RawServer(handler)
        async with server as url:
            client = HttpUpstream(url, 2, 5)
            resp = await client.request("POST", "/x", b"1")
            assert await resp.read_all() == b"first"
            resp.release()
            resp = await client.request("POST", "/x", b"2")  # reused, dropped, sent again
            assert await resp.read_all() == b"first"
            resp.release()
            assert server.num_connections == 2
            client.close()

    run(loop_factory, main())


@LOOPS
def test_fresh_connection_closed_before_the_response_is_an_error(loop_factory: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)

    async def main() -> None:
        server = RawServer(handler)
        async with server as url:
            client = HttpUpstream(url, 2, 5)
            with pytest.raises(UpstreamError):
                await client.request("POST", "/x", b"1")
            assert server.num_connections == 1  # not retried: nothing says it was a race

    run(loop_factory, main())


@LOOPS
def test_connection_refused(loop_factory: Any) -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        client = HttpUpstream(f"http://127.0.0.1:{port}", 2, 5)
        with pytest.raises(UpstreamError, match="cannot connect"):
            await client.request("POST", "/x", b"1")

    run(loop_factory, main())


@LOOPS
def test_server_dying_mid_body_raises_after_the_bytes_it_sent(loop_factory: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()  # reset, no terminating chunk

    async def main() -> None:
        server = RawServer(handler)
        async with server as url:
            client = HttpUpstream(url, 2, 5)
            resp = await client.request("POST", "/x", b"1")
            assert await resp.read() == b"hello"
            with pytest.raises(UpstreamError, match="lost mid-response"):
                await resp.read()
            resp.release()
            assert client._idle == []  # a broken connection is never reused

    run(loop_factory, main())


@LOOPS
def test_silent_server_times_out(loop_factory: Any) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async def main() -> None:
        server = RawServer(handler)
        async with server as url:
            client = HttpUpstream(url, 2, 0.3)
            resp = await client.request("POST", "/x", b"1")
            assert await resp.read() == b"ok"
            loop = asyncio.get_running_loop()
            start_s = loop.time()
            with pytest.raises(UpstreamTimeout):
                await resp.read()
            assert 0.25 < loop.time() - start_s < 2.0
            resp.close()

    run(loop_factory, main())


@LOOPS
def test_trickled_bytes_and_close_delimited_body(loop_factory: Any) -> None:
    """Head and chunks split at every byte; then a body that ends when the server closes."""
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 1:
            for i in range(len(chunked)):
                writer.write(chunked[i : i + 1])
                await writer.drain()
                await asyncio.sleep(0.001)
            await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close")
        await writer.drain()

    async def main() -> None:
        server = RawServer(handler)
        async with server as url:
            client = HttpUpstream(url, 2, 5)
            resp = await client.request("POST", "/x", b"1")
            assert await resp.read_all() == b"abcde"
            resp.release()
            resp = await client.request("POST", "/x", b"2")  # same connection
            assert await resp.read_all() == b"until close"
            resp.release()
            assert server.num_connections == 1 and client._idle == []

    run(loop_factory, main())


@LOOPS
def test_large_body_read_slowly_arrives_intact(loop_factory: Any) -> None:
    """More than the high-water mark buffered: reading pauses and resumes the socket."""
    body = bytes(range(256)) * 8192  # 2 MiB

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(response(body))
        await writer.drain()
        await reader.read()  # keep the connection open until the client is done

    async def main() -> None:
        server = RawServer(handler)
        async with server as url:
            client = HttpUpstream(url, 2, 5)
            resp = await client.request("POST", "/x", b"1")
            await asyncio.sleep(0.2)  # let the socket fill the buffer past the mark
            assert resp._connection._is_paused
            received = bytearray()
            while data := await resp.read():
                received += data
            assert bytes(received) == body
            resp.release()
            client.close()

    run(loop_factory, main())


@LOOPS
def test_idle_connections_are_capped_and_closed_ones_pruned(
    loop_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engines.http_upstream._MAX_IDLE", 2)
    writers: list[asyncio.StreamWriter] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writers.append(writer)
        while True:
            await read_request(reader)
            writer.write(response(b"ok"))
            await writer.drain()

    async def main() -> None:
        server = RawServer(handler)
        async with server as url:
            client = HttpUpstream(url, 2, 5)
            responses = [await client.request("POST", "/x", b"1") for _ in range(3)]
            for resp in responses:
                assert await resp.read_all() == b"ok"
            responses[0].release()
            responses[1].release()
            for writer in writers[:2]:
                writer.close()  # the server drops both idle connections
            await asyncio.sleep(0.1)
            responses[2].release()  # at the cap: the closed ones go, this one stays
            assert [c.is_open() for c in client._idle] == [True]
            more = [await client.request("POST", "/x", b"2") for _ in range(3)]
            for resp in more:
                assert await resp.read_all() == b"ok"
                resp.release()
            assert len(client._idle) == 2 and server.num_connections == 5
            client.close()

    run(loop_factory, main())
