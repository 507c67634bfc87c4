"""A streaming response for relayed SSE: Starlette's StreamingResponse minus its task group.

Under uvicorn (ASGI spec 2.3) StreamingResponse runs the body and a disconnect listener in
an anyio task group per response, which is a measurable share of the gateway's CPU per
request. Here the send loop checks between chunks whether the client has gone; if so, the
body iterator is closed so the upstream request is dropped (and the backend stops
generating) instead of running to the end. uvicorn's send() silently drops data for a gone
client, so the check needs its own signal: uvicorn's per-request cycle (the object ``send``
is bound to) keeps a ``disconnected`` flag, read directly when it is there; any other
server gets a plain asyncio task waiting for ``http.disconnect``.

The gateway's per-request bookkeeping rides on ``on_done`` rather than on another async
generator around the body: every layer costs CPU on every relayed chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

# Called once when the response ends: (time the first chunk arrived, whether it timed out).
OnDone = Callable[[float | None, bool], None]


class RelayResponse(Response):
    def __init__(
        self,
        body: AsyncIterator[bytes],
        raw_headers: list[tuple[bytes, bytes]],
        deadline_s: float,
        timeout_event: bytes,
        on_done: OnDone,
    ) -> None:
        """``raw_headers``: complete and encoded (content-type included), sent as they are."""
        self.body_iterator = body
        self.status_code = 200
        self.background = None
        self.raw_headers = raw_headers
        self.deadline_s = deadline_s
        self.timeout_event = timeout_event
        self.on_done = on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = _disconnect_signal(receive, send)
        first_s: float | None = None
        is_timed_out = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                if first_s is None:
                    first_s = time.perf_counter()
                if gone.done():
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if time.perf_counter() > self.deadline_s:
                    is_timed_out = True
                    message = {"type": "http.response.body", "body": self.timeout_event}
                    await send({**message, "more_body": True})
                    break
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if isinstance(gone, asyncio.Future):
                gone.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await gone
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            self.on_done(first_s, is_timed_out)


class _CycleFlag:
    """``done()`` once uvicorn's request cycle has seen the client disconnect."""

    def __init__(self, cycle: object) -> None:
        self._cycle = cycle

    def done(self) -> bool:
        return bool(getattr(self._cycle, "disconnected", False))


def _disconnect_signal(receive: Receive, send: Send) -> _CycleFlag | asyncio.Future[None]:
    cycle = getattr(send, "__self__", None)
    if cycle is not None and isinstance(getattr(cycle, "disconnected", None), bool):
        return _CycleFlag(cycle)
    return asyncio.ensure_future(_wait_disconnect(receive))


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
