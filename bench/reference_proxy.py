"""The smallest useful streaming proxy (Starlette/uvicorn + aiohttp client, no logic).

gateway_overhead.py runs it next to draftctl as a yardstick: on a shared machine the
difference between the two says what draftctl's own work costs, apart from the machine.

    python bench/reference_proxy.py UPSTREAM_URL PORT
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def build(upstream: str) -> Starlette:
    sessions: list[aiohttp.ClientSession] = []

    async def chat(request: Request) -> Response:
        if not sessions:
            sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        resp = await sessions[0].post(
            upstream + "/v1/chat/completions",
            data=await request.body(),
            headers={"content-type": "application/json"},
        )

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for data in resp.content.iter_any():
                    yield data
            finally:
                resp.release()

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response("ok")

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/healthz", health),
    ]
    return Starlette(routes=routes)


if __name__ == "__main__":
    uvicorn.run(
        build(sys.argv[1]),
        host="127.0.0.1",
        port=int(sys.argv[2]),
        http="httptools",
        loop="uvloop",
        log_level="warning",
        access_log=False,
    )
