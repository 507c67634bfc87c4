"""A streaming response for relayed SSE: Starlette's StreamingResponse minus its task group.

Under uvicorn (ASGI spec 2.3) StreamingResponse runs the body and a disconnect listener in
an anyio task group per response, which is a measurable share of the gateway's CPU per
request. Here one plain asyncio task waits for ``http.disconnect`` and the send loop checks
it between chunks; when the client has gone, the body iterator is closed so the upstream
request is dropped (and the backend stops generating) instead of running to the end.

The gateway's per-request bookkeeping rides on ``on_done`` rather than on another async
generator around the body: every layer costs CPU on every relayed chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

# Called once when the response ends: (time the first chunk arrived, whether it timed out).
OnDone = Callable[[float | None, bool], None]


class RelayResponse(Response):
    def __init__(
        self,
        body: AsyncIterator[bytes],
        headers: Mapping[str, str],
        media_type: str,
        deadline_s: float,
        timeout_event: bytes,
        on_done: OnDone,
    ) -> None:
        self.body_iterator = body
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)
        self.deadline_s = deadline_s
        self.timeout_event = timeout_event
        self.on_done = on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(_wait_disconnect(receive))
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
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            self.on_done(first_s, is_timed_out)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
