"""A lean HTTP/1.1 client for one upstream server: keep-alive connections, streamed bodies.

``HttpUpstream(url)`` holds the idle keep-alive connections to one server (no limit on how
many are open, like aiohttp's ``limit=0``: 256 streams never wait for a connection).
``request()`` returns once the response headers are in; the body is read with
``UpstreamResponse.read()`` as it arrives, and ``release()`` hands the connection back for
the next request (or closes it if the body was not read to the end).

A request on a reused keep-alive connection that fails before any response byte is sent
again once on a fresh connection: the server may have closed the idle connection just as
it was picked (uvicorn closes idle connections after 5 s), which says nothing about the
server's health. Any other failure is an ``UpstreamError`` for the caller to judge.
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

from engines.http_connection import Connection, UpstreamError, UpstreamTimeout

__all__ = ["HttpUpstream", "UpstreamError", "UpstreamResponse", "UpstreamTimeout"]

# Idle connections kept per server beyond this are closed when handed back.
_MAX_IDLE = 1024


class UpstreamResponse:
    """Status, headers and the streamed body of one response."""

    def __init__(self, upstream: HttpUpstream, connection: Connection) -> None:
        self._upstream = upstream
        self._connection = connection
        self.status = connection.status
        self.read = connection.read  # read() -> the next body bytes, b"" at the end
        self._is_released = False

    def header(self, name: str, default: str = "") -> str:
        """The first header called ``name`` (case-insensitive), decoded as latin-1."""
        wanted = name.lower().encode()
        for key, value in self._connection.headers:
            if key == wanted:
                return value.decode("latin-1")
        return default

    async def read_all(self) -> bytes:
        parts = []
        while data := await self.read():
            parts.append(data)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the response: reuse the connection if the body was read to the end."""
        if self._is_released:
            return
        self._is_released = True
        self._upstream.give_back(self._connection)

    def close(self) -> None:
        """Done with the response, whatever is left of it: the connection is closed.

        A no-op after ``release()``: the connection may already serve another request.
        """
        if self._is_released:
            return
        self._is_released = True
        self._connection.close()


class HttpUpstream:
    """Keep-alive HTTP/1.1 client for one server URL (``http://`` or ``https://``)."""

    def __init__(self, url: str, connect_timeout_s: float, read_timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream URL {url!r} must look like http://host:port")
        self.url = url
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._base_path = parts.path.rstrip("/")
        self._host_header = parts.netloc.encode("idna")
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._idle: list[Connection] = []
        self._heads: dict[tuple[str, str, str], bytes] = {}

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> UpstreamResponse:
        """Send one request; returns when the response headers are in.

        ``timeout_s`` bounds the whole wait for the headers (connect included).
        """
        message = self._head(method, path, content_type) + str(len(body)).encode()
        message += b"\r\n\r\n" + body
        if timeout_s is None:  # the hot path: the caller bounds the request as a whole
            return await self._send(message)
        async with asyncio.timeout(timeout_s):
            return await self._send(message)

    def give_back(self, connection: Connection) -> None:
        if not connection.can_reuse():
            connection.close()
            return
        if len(self._idle) >= _MAX_IDLE:  # drop the ones the server closed meanwhile first
            self._idle = [c for c in self._idle if c.is_open()]
        if len(self._idle) >= _MAX_IDLE:
            connection.close()
            return
        connection.is_reused = True
        self._idle.append(connection)

    def close(self) -> None:
        """Close every idle connection (responses in flight close with their readers)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def _send(self, message: bytes) -> UpstreamResponse:
        connection = await self._connection()
        try:
            return await self._exchange(connection, message)
        except UpstreamError:
            if not connection.is_reused or connection.has_response_bytes:
                raise
        # A reused idle connection died as it was picked: one fresh try.
        return await self._exchange(await self._connect(), message)

    async def _exchange(self, connection: Connection, message: bytes) -> UpstreamResponse:
        connection.start(message)
        try:
            await connection.wait_headers()
        except BaseException:
            connection.close()
            raise
        return UpstreamResponse(self, connection)

    async def _connection(self) -> Connection:
        idle = self._idle
        while idle:
            connection = idle.pop()  # the most recently used is the likeliest still open
            if connection.is_open():
                return connection
        return await self._connect()

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, protocol = await loop.create_connection(
                    lambda: Connection(loop, self._read_timeout_s),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"connecting to {self.url} took longer than {self._connect_timeout_s:g} s"
            ) from exc
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {self.url}: {exc}") from exc
        return protocol

    def _head(self, method: str, path: str, content_type: str) -> bytes:
        key = (method, path, content_type)
        head = self._heads.get(key)
        if head is None:
            head = self._heads[key] = (
                f"{method} {self._base_path}{path} HTTP/1.1\r\n".encode()
                + b"Host: "
                + self._host_header
                + f"\r\nContent-Type: {content_type}\r\nContent-Length: ".encode()
            )
        return head
