"""A streaming response for relayed SSE: Starlette's StreamingResponse minus its task group.

Under uvicorn (ASGI spec 2.3) StreamingResponse runs the body and a disconnect listener in
an anyio task group per response, which is a measurable share of the gateway's CPU per
request. Here one plain asyncio task waits for ``http.disconnect`` and the send loop checks
it between chunks; when the client has gone, the body iterator is closed so the upstream
request is dropped (and the backend stops generating) instead of running to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class RelayResponse(Response):
    def __init__(
        self,
        body: AsyncIterator[bytes],
        status_code: int,
        headers: Mapping[str, str],
        media_type: str,
    ) -> None:
        self.body_iterator = body
        self.status_code = status_code
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in self.body_iterator:
                if gone.done():
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
