"""A well-formed client beside the traffic under test: greedy streams, back to back.

Every canary stream must end whole (200, chunks, ``[DONE]``, no error event) whatever the
other clients send; one that does not is the "other clients' requests unaffected" target
failing.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future

import aiohttp

from tests.dashboard.daemon import LoopThread
from tests.robustness.client import Sent, exchange
from tests.robustness.daemon import MODEL
from tests.robustness.verdict import Tally, problem

TIMEOUT_S = 90.0
CANARY = Sent(
    "POST",
    "/v1/chat/completions",
    json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Count from one to ten."}],
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
        }
    ).encode(),
    {"content-type": "application/json"},
)
COMPANION = Sent(
    "POST",
    "/v1/completions",
    json.dumps({"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 4}).encode(),
    {"content-type": "application/json"},
)


def well_formed_problem(sent: Sent, status: int | None, found: str | None) -> str | None:
    """A well-formed request must be a 200 that meets every target."""
    if found is None and status != 200:
        return f"status_{status}"
    return found


async def check(session: aiohttp.ClientSession, base: str, sent: Sent, tally: Tally) -> None:
    answer = await exchange(session, base, sent, TIMEOUT_S)
    found = well_formed_problem(sent, answer.status, problem(answer, True))
    tally.add(sent, answer, found)


class Canary:
    def __init__(self, loops: LoopThread, session: aiohttp.ClientSession, base: str) -> None:
        self.tally = Tally()
        self._is_stopping = False
        self._running: Future[None] = asyncio.run_coroutine_threadsafe(
            self._run(session, base), loops.loop
        )

    async def _run(self, session: aiohttp.ClientSession, base: str) -> None:
        while not self._is_stopping:
            await check(session, base, CANARY, self.tally)

    def stop(self) -> Tally:
        self._is_stopping = True
        self._running.result(TIMEOUT_S + 10)
        return self.tally
