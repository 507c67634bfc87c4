"""A soak: many mixed requests against a daemon, some of whose clients leave early.

Requests are chat or completions, streamed or whole, greedy or sampled, with seeds and stop
strings; about one in five clients leaves on purpose (a stream after 0-3 reads, a whole
answer after 0-300 ms). Every other request must end whole: no hang ("stuck"), and no
failure, 5xx, empty or truncated answer ("lost").
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.robustness.client import Answer, Sent, exchange
from tests.robustness.daemon import MODEL
from tests.robustness.verdict import Tally, problem

TIMEOUT_S = 120.0
LEAVE_SHARE = 0.2
PROMPTS = [
    "What is 17 * 23?",
    "Write a Python function that reverses a list.",
    "Tell me about the sea.",
    "def fib(n):",
]


@dataclass(frozen=True)
class SoakRequest:
    sent: Sent
    leave_after_chunks: int | None
    leave_after_s: float | None


def draw(rng: random.Random, model: str, vocab_size: int) -> SoakRequest:
    is_chat = rng.random() < 0.5
    is_stream = rng.random() < 0.5
    prompt = rng.choice(PROMPTS)
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": rng.randint(1, 10),
        "temperature": rng.choice([0, 0.7, 1.0]),
        "stream": is_stream,
    }
    if is_chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = (
            prompt if rng.random() < 0.7 else [rng.randrange(vocab_size) for _ in range(8)]
        )
    if rng.random() < 0.3:
        body["seed"] = rng.randrange(-(2**63), 2**63)
    if rng.random() < 0.2:
        body["stop"] = rng.choice(["\n", ["e", "."], "the"])
    if is_stream and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions" if is_chat else "/v1/completions"
    sent = Sent("POST", path, json.dumps(body).encode(), {"content-type": "application/json"})
    if rng.random() >= LEAVE_SHARE:
        return SoakRequest(sent, None, None)
    if is_stream:
        return SoakRequest(sent, rng.randint(0, 3), None)
    return SoakRequest(sent, None, rng.uniform(0, 0.3))


def soak_problem(answer: Answer) -> str | None:
    """Issue 15's soak terms: a hang is "stuck"; any other failure, or a non-200, "lost"."""
    found = problem(answer, True)
    if found == "hang":
        return "stuck"
    if found is not None or (not answer.is_left and answer.status != 200):
        return "lost"
    return None


async def soak(
    session: aiohttp.ClientSession,
    base: str,
    num_requests: int,
    concurrency: int,
    seed: int,
    model: str = MODEL,
    vocab_size: int = 6144,  # the demo target's
) -> Tally:
    rng = random.Random(seed)
    requests = [draw(rng, model, vocab_size) for _ in range(num_requests)]
    tally = Tally()
    gate = asyncio.Semaphore(concurrency)

    async def one(request: SoakRequest) -> None:
        async with gate:
            answer = await exchange(
                session,
                base,
                request.sent,
                TIMEOUT_S,
                request.leave_after_chunks,
                request.leave_after_s,
            )
        tally.add(request.sent, answer, soak_problem(answer))

    await asyncio.gather(*(one(r) for r in requests))
    return tally
