"""RelayResponse stops relaying once the client has gone, with or without uvicorn's flag."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from controller.relay_response import RelayResponse


class Body:
    def __init__(self) -> None:
        self.num_sent = 0
        self.is_closed = False

    async def stream(self) -> AsyncIterator[bytes]:
        try:
            for _ in range(200):
                self.num_sent += 1
                yield b"data: x\n\n"
                await asyncio.sleep(0.005)
        finally:
            self.is_closed = True


class Cycle:
    """Shaped like uvicorn's RequestResponseCycle: send() drops data once disconnected."""

    def __init__(self, gone_after: int) -> None:
        self.disconnected = False
        self.gone_after = gone_after
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        if self.disconnected:
            return
        self.messages.append(message)
        if len(self.messages) >= self.gone_after:
            self.disconnected = True

    async def receive(self) -> dict[str, Any]:
        raise AssertionError("the flag is read; receive() is not needed")


async def _relay(body: Body, receive: Any, send: Any) -> list[tuple[float | None, bool]]:
    done: list[tuple[float | None, bool]] = []
    response = RelayResponse(
        body.stream(), [], time.perf_counter() + 60, b"", lambda *a: done.append(a)
    )
    await asyncio.wait_for(response({"type": "http"}, receive, send), 5)
    return done


async def test_uvicorn_disconnected_flag_stops_the_relay() -> None:
    body, cycle = Body(), Cycle(gone_after=3)
    done = await _relay(body, cycle.receive, cycle.send)
    assert body.is_closed and body.num_sent <= 4
    assert len(done) == 1 and done[0][0] is not None


async def test_other_servers_get_a_disconnect_listener() -> None:
    body = Body()
    gone = asyncio.Event()
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)
        if len(messages) == 3:
            gone.set()

    done = await _relay(body, receive, send)
    assert body.is_closed and body.num_sent < 10
    assert len(done) == 1
