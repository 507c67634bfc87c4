"""The gateway's relayed stream: a RelayResponse that settles its accounts however it ends.

It calls ``on_done`` (which gives back the request's in-flight place and frees its backend
slot) even when the relay itself failed to, and when the shutdown cuts it — uvicorn cancels
whatever still runs once ``server.drain_timeout_s`` is up — it ends with an SSE error event
saying so instead of a silent close.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.types import Receive, Scope, Send

from controller.relay_response import OnDone, RelayResponse


class GatewayStream(RelayResponse):
    def __init__(
        self,
        body: AsyncIterator[bytes],
        raw_headers: list[tuple[bytes, bytes]],
        deadline_s: float,
        timeout_event: bytes,
        on_done: OnDone,
        is_draining: Callable[[], bool],
        shutdown_event: bytes,
    ) -> None:
        """``on_done`` must be idempotent: it may be called twice."""
        super().__init__(body, raw_headers, deadline_s, timeout_event, on_done)
        self.is_draining = is_draining
        self.shutdown_event = shutdown_event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            if not self.is_draining():
                raise
            # The task ends here either way; first tell the client why its stream stops.
            with contextlib.suppress(Exception):  # the client may be gone, or the end sent
                body = {"type": "http.response.body", "body": self.shutdown_event}
                await send({**body, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.on_done(None, False)  # a no-op when the relay has called it
