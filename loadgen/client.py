"""One streamed chat completion, timed: TTFT, TPOT, output tokens and the accept length.

The accept length is read from what the endpoint reports per response: a draftctl daemon's
``draftctl`` object (final chunk), else vLLM's ``metrics.speculative_decoding`` (servers run
with ``--per-request-spec-decode-metrics``) or SGLang's spec details on the usage chunk, with
the parsers the daemon itself uses (engines/outcome_readers.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from engines.base import Outcome
from engines.outcome_readers import reader_for

_READERS = (reader_for("vllm"), reader_for("sglang"))


@dataclass
class Sample:
    """One request's measurements (None: not measured, e.g. no token arrived)."""

    ok: bool
    latency_s: float
    ttft_s: float | None = None
    decode_s: float | None = None  # first content chunk to the last
    output_tokens: int = 0
    accept_length: float | None = None
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.decode_s is None or self.output_tokens < 2:
            return None
        return self.decode_s / (self.output_tokens - 1)


def request_body(
    model: str, messages: list[dict[str, Any]], max_tokens: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """A greedy streamed chat request; ``extra`` is merged in (SGLang servers report a
    request's speculation only with ``{"return_spec_tokens_details": true}``)."""
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


async def stream_chat(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float
) -> Sample:
    """POST ``body`` to ``url``/v1/chat/completions and read the stream to its end."""
    started = time.perf_counter()
    reading = _Reading(started)
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(f"{url}/v1/chat/completions", json=body, timeout=timeout) as r:
            if r.status != 200:
                text = (await r.text())[:300]
                return Sample(False, time.perf_counter() - started, error=f"{r.status}: {text}")
            async for line in r.content:
                reading.line(line)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Sample(False, time.perf_counter() - started, error=f"{type(exc).__name__}: {exc}")
    return reading.sample(time.perf_counter())


class _Reading:
    """What the SSE lines of one response said so far."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first: float | None = None
        self.last: float | None = None
        self.num_chunks = 0
        self.usage_tokens: int | None = None
        self.accept: float | None = None
        self.error: str | None = None

    def line(self, line: bytes) -> None:
        if not line.startswith(b"data: {"):
            return
        now = time.perf_counter()
        obj = orjson.loads(line[6:])
        if "error" in obj:
            self.error = str(obj["error"].get("message", obj["error"]))[:300]
        for choice in obj.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                self.first = self.first or now
                self.last = now
                self.num_chunks += 1
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        self.accept = accept_length(obj) or self.accept

    def sample(self, ended: float) -> Sample:
        tokens = self.usage_tokens if self.usage_tokens is not None else self.num_chunks
        first, last = self.first, self.last
        return Sample(
            ok=self.error is None,
            latency_s=ended - self.started,
            ttft_s=None if first is None else first - self.started,
            decode_s=None if first is None or last is None else last - first,
            output_tokens=tokens,
            accept_length=self.accept,
            error=self.error,
        )


def accept_length(obj: dict[str, Any]) -> float | None:
    """The mean accept length a response chunk or body reports, if any."""
    annotation = obj.get("draftctl")
    if isinstance(annotation, dict) and isinstance(annotation.get("accept_length"), int | float):
        return float(annotation["accept_length"])
    for read in _READERS:
        outcome: Outcome | None = read(obj)
        if outcome is not None and outcome.mean_accept_length is not None:
            return outcome.mean_accept_length
    return None
