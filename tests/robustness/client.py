"""One HTTP exchange with the daemon, bounded in time, recorded as an ``Answer``.

The client is aiohttp on one event loop (a ``LoopThread`` for the synchronous hypothesis
tests). A request that has not finished within ``timeout_s`` is a hang. A client that leaves
on purpose (``leave_after_chunks`` for a stream, ``leave_after_s`` for a whole answer) is
recorded as such, not as a failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp


@dataclass
class Sent:
    """What to send: bytes exactly as given (malformed JSON included)."""

    method: str
    path: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    is_chunked: bool = False  # send the body with Transfer-Encoding: chunked

    def describe(self, limit: int = 300) -> str:
        body = b"" if self.body is None else self.body
        shown = body[:limit] + (b"..." if len(body) > limit else b"")
        return f"{self.method} {self.path} headers={self.headers} body[{len(body)}]={shown!r}"


@dataclass
class Answer:
    status: int | None  # None: no status line arrived
    body: bytes
    content_type: str
    elapsed_s: float
    is_hang: bool = False  # still unanswered (or unfinished) at the client's timeout
    is_left: bool = False  # the client left on purpose before the end
    transport_error: str | None = None  # the connection failed without the client leaving


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(body), 4096):
        yield body[i : i + 4096]


async def exchange(
    session: aiohttp.ClientSession,
    base: str,
    sent: Sent,
    timeout_s: float,
    leave_after_chunks: int | None = None,
    leave_after_s: float | None = None,
) -> Answer:
    started = time.perf_counter()
    chunks: list[bytes] = []
    status: int | None = None
    content_type = ""
    data = _chunks(sent.body) if sent.is_chunked and sent.body is not None else sent.body

    async def run() -> None:
        nonlocal status, content_type
        async with session.request(
            sent.method, base + sent.path, data=data, headers=sent.headers
        ) as response:
            status = response.status
            content_type = response.headers.get("content-type", "")
            if leave_after_chunks is not None:
                for _ in range(leave_after_chunks):
                    piece = await response.content.readany()
                    if not piece:
                        return
                    chunks.append(piece)
                response.close()  # drop the connection mid-stream
                raise _Left
            chunks.append(await response.read())

    def answer(**flags: object) -> Answer:
        elapsed_s = time.perf_counter() - started
        return Answer(status, b"".join(chunks), content_type, elapsed_s, **flags)  # type: ignore[arg-type]

    limit_s = timeout_s if leave_after_s is None else min(timeout_s, leave_after_s)
    try:
        await asyncio.wait_for(run(), limit_s)
    except _Left:
        return answer(is_left=True)
    except TimeoutError:
        if leave_after_s is not None and leave_after_s < timeout_s:
            return answer(is_left=True)
        return answer(is_hang=True)
    except (aiohttp.ClientError, OSError) as exc:
        return answer(transport_error=f"{type(exc).__name__}: {exc}")
    return answer()


class _Left(Exception):
    """The client closed the connection on purpose."""


def session() -> aiohttp.ClientSession:
    # No connection limit: the canary and the companions must never queue behind the fuzz.
    # Idle connections are let go before the daemon closes them (keep_alive_timeout_s, 5 s):
    # reusing one the server is closing at that moment would fail for no fault of the daemon.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False)
