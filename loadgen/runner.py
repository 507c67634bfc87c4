"""Closed loop at one concurrency: N clients, each sending its next request when one ends."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from loadgen.client import Sample, request_body, stream_chat
from loadgen.prompts import Messages


@dataclass(frozen=True)
class Load:
    url: str
    model: str
    max_tokens: int
    timeout_s: float
    extra_body: dict[str, Any]


@dataclass
class Run:
    samples: list[Sample]
    duration_s: float  # first request sent to last one ended


async def closed_loop(
    session: aiohttp.ClientSession,
    load: Load,
    prompts: list[Messages],
    concurrency: int,
    num_requests: int,
    on_done: Callable[[Sample], None],
) -> Run:
    """``num_requests`` requests over ``prompts`` (cycled, in order), ``concurrency`` at once."""
    queue: Iterator[Messages] = itertools.islice(itertools.cycle(prompts), num_requests)
    samples: list[Sample] = []

    async def client() -> None:
        for messages in queue:  # one shared iterator: each prompt is taken once
            body = request_body(load.model, messages, load.max_tokens, load.extra_body)
            sample = await stream_chat(session, load.url, body, load.timeout_s)
            samples.append(sample)
            on_done(sample)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(min(concurrency, num_requests))))
    return Run(samples, time.perf_counter() - started)


async def warm_up(session: aiohttp.ClientSession, load: Load, prompts: list[Messages]) -> None:
    """One short request, so a cold server's first compile or cache fill is not measured."""
    body = request_body(load.model, prompts[0], min(8, load.max_tokens), load.extra_body)
    sample = await stream_chat(session, load.url, body, load.timeout_s)
    if not sample.ok:
        raise ConnectionError(f"{load.url} did not answer the warm-up request: {sample.error}")
