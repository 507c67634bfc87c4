"""One keep-alive HTTP/1.1 connection to an upstream server: an asyncio Protocol + httptools.

The gateway's hot path relays thousands of short streams a second; a general HTTP client
(aiohttp) spends a visible share of the gateway's CPU on per-request machinery it does not
need here. This connection does only what a relay needs: write one request, parse the
response with httptools (Content-Length, chunked, or close-delimited bodies), and hand body
bytes to one reader as they arrive, pausing the socket when the reader falls behind.

Every failure surfaces as an ``UpstreamError`` from ``wait_headers()`` or ``read()``;
``has_response_bytes`` tells the caller whether the server had answered anything yet (a
request that failed before that may be retried elsewhere).
"""

from __future__ import annotations

import asyncio
from typing import cast

import httptools

# Buffered body bytes above which the socket stops being read until the reader catches up.
_HIGH_WATER_BYTES = 256 * 1024


class UpstreamError(Exception):
    """The upstream connection failed: refused, reset, timed out or sent a bad response."""


class UpstreamTimeout(UpstreamError):
    """The upstream server sent nothing for longer than the read timeout."""


class Connection(asyncio.Protocol):
    """One TCP connection; serves one request at a time (``start`` → headers → body)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout_s: float) -> None:
        self._loop = loop
        self._read_timeout_s = read_timeout_s
        self.transport: asyncio.Transport | None = None
        self.is_closed = False
        self.is_reused = False
        self.has_response_bytes = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.is_complete = False
        self._can_keep_alive = False
        self._parser: httptools.HttpResponseParser | None = None
        self._body: list[bytes] = []
        self._num_buffered = 0
        self._is_paused = False
        self._is_close_delimited = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._has_headers = False
        self._last_data_s = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport does not subclass asyncio.Transport but has its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._last_data_s = self._loop.time()
        self.has_response_bytes = True
        if self._parser is None or self.is_complete:  # bytes nobody asked for: unusable
            self._fail(UpstreamError("upstream sent data outside a response"))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"invalid HTTP response from upstream: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost reports it

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_closed = True
        self._cancel_timer()
        if self._parser is None or self.is_complete:
            return
        if exc is None and self._has_headers and self._is_close_delimited:
            self.is_complete = True  # a body without length ends when the server closes
            self._wake()
            return
        why = f"{type(exc).__name__}: {exc}" if exc else "server closed the connection"
        self._fail(UpstreamError(f"upstream connection lost mid-response ({why})"))

    # -- httptools callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None, "parsing a response"
        self.status = self._parser.get_status_code()
        names = {name for name, _ in self.headers}
        self._is_close_delimited = b"content-length" not in names and (
            b"transfer-encoding" not in names
        )
        self._has_headers = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._num_buffered += len(body)
        if self._num_buffered > _HIGH_WATER_BYTES and not self._is_paused:
            assert self.transport is not None, "connected"
            self._is_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        assert self._parser is not None, "parsing a response"
        # Read now: llhttp resets the flags behind it once this callback returns.
        self._can_keep_alive = self._parser.should_keep_alive()
        self.is_complete = True
        self._cancel_timer()
        self._wake()

    # -- the caller's side -----------------------------------------------------------------

    def start(self, request: bytes) -> None:
        """Send one request (head and body in one buffer); the response starts afresh."""
        assert self.transport is not None and not self.is_closed, "an open connection"
        self._parser = httptools.HttpResponseParser(self)
        self.has_response_bytes = False
        self.status = 0
        self.headers = []
        self.is_complete = False
        self._can_keep_alive = False
        self._has_headers = False
        self._body = []
        self._num_buffered = 0
        self._error = None
        self._last_data_s = self._loop.time()
        self._arm_timer(self._read_timeout_s)
        self.transport.write(request)

    async def wait_headers(self) -> None:
        while not self._has_headers:
            await self._wait()

    async def read(self) -> bytes:
        """The body bytes received since the last read; b"" once the body is complete."""
        while not self._body:
            if self.is_complete:
                return b""
            # _wait() inlined: this runs once per relayed chunk.
            if self._error is not None:
                raise self._error
            if self.is_closed:
                raise UpstreamError("upstream connection is closed")
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
            if self._error is not None:
                raise self._error
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        self._body = []
        self._num_buffered = 0
        if self._is_paused:
            self._is_paused = False
            self._last_data_s = self._loop.time()  # the pause was ours, not the server's
            if self.transport is not None:
                self.transport.resume_reading()
        return data

    def is_open(self) -> bool:
        """Not closed, and not closing either (the server's FIN may be in already)."""
        return not self.is_closed and self.transport is not None and not self.transport.is_closing()

    def can_reuse(self) -> bool:
        """The response was read to its end and the server keeps the connection open."""
        return self.is_complete and self._can_keep_alive and not self.is_closed and not self._body

    def close(self) -> None:
        self._cancel_timer()
        if self.transport is not None and not self.is_closed:
            self.is_closed = True
            self.transport.close()

    # -- internals -------------------------------------------------------------------------

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        if self.is_closed:
            raise UpstreamError("upstream connection is closed")
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self.close()
        self._wake()

    def _arm_timer(self, delay_s: float) -> None:
        self._cancel_timer()
        self._timer = self._loop.call_later(delay_s, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        """Silence check, armed once per request rather than once per read."""
        self._timer = None
        if self.is_complete or self.is_closed:
            return
        silent_s = self._loop.time() - self._last_data_s
        if self._is_paused or silent_s < self._read_timeout_s:
            self._arm_timer(self._read_timeout_s - silent_s if not self._is_paused else 1.0)
            return
        self._fail(UpstreamTimeout(f"upstream sent nothing for {self._read_timeout_s:g} s"))
