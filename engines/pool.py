"""A pool of vLLM or SGLang servers started with one fixed k, reached over HTTP.

Within a pool a request goes to the healthy server with the fewest requests in flight.
A server that refuses a connection or answers 5xx before the first byte is marked down and
the next one is tried; when none is left the pool raises BackendUnavailable and the gateway
moves on to another pool. A periodic ``GET /health`` takes servers out (``unhealthy_after``
failed checks in a row: one slow answer from a busy server is not an outage) and puts them
back (one passing check); the check at start-up decides at once.
After the first byte a failure ends the client's stream with an error event, never a hang.
Requests and health checks go through engines/http_upstream.py (keep-alive, httptools).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson

from engines.base import (
    Annotator,
    BackendRequest,
    BackendResponse,
    BackendUnavailable,
)
from engines.config import PoolConfig
from engines.http_upstream import HttpUpstream, UpstreamError, UpstreamResponse
from engines.outcome_readers import reader_for, request_extras
from engines.request_body import upstream_body
from engines.sse import SseAnnotator, merge_outcome, with_draftctl_object

log = logging.getLogger(__name__)

_PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
_UPSTREAM_ERRORS = (UpstreamError, TimeoutError, ConnectionError)


@dataclass
class ServerSlot:
    url: str
    upstream: HttpUpstream = field(repr=False)
    is_healthy: bool = True
    num_inflight: int = 0
    failed_checks: int = 0  # consecutive failed health checks


class PoolBackend:
    """Implements engines.base.Backend for ``kind: vllm`` and ``kind: sglang`` pools."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.name = config.name
        self.kind: str = config.kind
        self.model = config.model
        self.block_size = config.block_size
        self.max_spec_tokens = config.spec_tokens
        self.is_adjustable = False
        self.slots = [
            ServerSlot(url, HttpUpstream(url, config.connect_timeout_s, config.timeout_s))
            for url in config.urls
        ]
        self._read_outcome = reader_for(config.kind)
        self._health_task: asyncio.Task[None] | None = None
        self._turn = 0
        self._checked_once = False  # the start-up check decides at once

    def is_healthy(self) -> bool:
        return any(s.is_healthy for s in self.slots)

    def num_inflight(self) -> int:
        return sum(s.num_inflight for s in self.slots)

    def num_servers(self) -> int:
        return max(1, sum(1 for s in self.slots if s.is_healthy))

    async def start(self) -> None:
        await self.check_health()
        self._health_task = asyncio.create_task(self._health_loop(), name=f"health-{self.name}")

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
        for slot in self.slots:
            slot.upstream.close()

    async def check_health(self) -> None:
        await asyncio.gather(*(self._check(slot) for slot in self.slots))
        self._checked_once = True

    async def _check(self, slot: ServerSlot) -> None:
        timeout_s = self.config.health_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                resp = await slot.upstream.request("GET", "/health")
                try:
                    await resp.read_all()
                finally:
                    resp.release()
            is_up = resp.status == 200
        except _UPSTREAM_ERRORS:
            is_up = False
        slot.failed_checks = 0 if is_up else slot.failed_checks + 1
        if not is_up and slot.is_healthy and self._checked_once:
            if slot.failed_checks < self.config.unhealthy_after:
                log.info(
                    "pool %s: server %s failed a health check (%d of %d in a row take it out)",
                    self.name,
                    slot.url,
                    slot.failed_checks,
                    self.config.unhealthy_after,
                )
                return
        if is_up != slot.is_healthy:
            log.warning("pool %s: server %s is %s", self.name, slot.url, "up" if is_up else "down")
        slot.is_healthy = is_up

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await self.check_health()

    def _pick(self, tried: set[str]) -> ServerSlot | None:
        if len(self.slots) == 1:  # a pool of one server: no list, rotation or min()
            slot = self.slots[0]
            return slot if slot.is_healthy and slot.url not in tried else None
        candidates = [s for s in self.slots if s.is_healthy and s.url not in tried]
        if not candidates:
            return None
        self._turn += 1
        start = self._turn % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda s: s.num_inflight)

    def _mark_down(self, slot: ServerSlot, why: str) -> None:
        if slot.is_healthy:
            log.warning("pool %s: server %s taken out: %s", self.name, slot.url, why)
        slot.is_healthy = False

    async def submit(
        self, request: BackendRequest, spec_tokens: int, annotate: Annotator
    ) -> BackendResponse:
        # Per-request spec-decode metrics ride on the usage chunk: streams always ask for it.
        payload, wants_usage = upstream_body(
            request.body, request.raw, request_extras(self.kind, spec_tokens), request.stream
        )
        tried: set[str] = set()
        while (slot := self._pick(tried)) is not None:
            tried.add(slot.url)
            response = await self._try(slot, request, payload, annotate, wants_usage)
            if response is not None:
                return response
        raise BackendUnavailable(f"pool {self.name}: no healthy server accepted the request")

    async def _try(
        self,
        slot: ServerSlot,
        request: BackendRequest,
        payload: bytes,
        annotate: Annotator,
        wants_usage: bool,
    ) -> BackendResponse | None:
        """One attempt on one server: a response, or None if it failed before the first byte.

        The slot's in-flight count is released here unless a stream was handed over (its
        relay releases it), also when the caller is cancelled (a timeout).
        """
        slot.num_inflight += 1
        is_handed_over = False
        resp: UpstreamResponse | None = None
        try:
            resp = await slot.upstream.request("POST", _PATHS[request.endpoint], payload)
            if resp.status >= 500:
                self._mark_down(slot, f"HTTP {resp.status} before the first byte")
                return None
            if resp.status != 200 or not request.stream:
                return await self._whole(resp, annotate)
            response = await self._stream(slot, resp, annotate, wants_usage)
            is_handed_over = True
            return response
        except _UPSTREAM_ERRORS as exc:
            self._mark_down(slot, f"{type(exc).__name__} before the first byte: {exc}")
            return None
        finally:
            if not is_handed_over:
                slot.num_inflight -= 1
                if resp is not None:
                    resp.close()

    async def _whole(self, resp: UpstreamResponse, annotate: Annotator) -> BackendResponse:
        raw = await resp.read_all()
        resp.release()
        media_type = resp.header("content-type", "application/json")
        response = BackendResponse(resp.status, media_type, _once(raw))
        if resp.status != 200:
            return response
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return response
        if not isinstance(obj, dict):
            return response
        merge_outcome(response.outcome, self._read_outcome(obj), obj)
        annotation = annotate(response.outcome)
        body = with_draftctl_object(obj, raw, annotation)
        response.body = _once(body or orjson.dumps({**obj, "draftctl": annotation}))
        return response

    async def _stream(
        self,
        slot: ServerSlot,
        resp: UpstreamResponse,
        annotate: Annotator,
        wants_usage: bool,
    ) -> BackendResponse:
        first = await resp.read()  # retryable until this arrives
        if not first:
            raise UpstreamError("stream closed before the first byte")
        annotator = SseAnnotator(annotate, self._read_outcome, wants_usage)
        lease = _Lease(slot, resp)
        response = BackendResponse(200, "text/event-stream", _once(b""), annotator.outcome)
        response.body = self._relay(lease, annotator, first, response)
        response.release = lease.end  # in case the body is closed before it ever ran
        return response

    async def _relay(
        self,
        lease: _Lease,
        annotator: SseAnnotator,
        first: bytes,
        response: BackendResponse,
    ) -> AsyncIterator[bytes]:
        read = lease.resp.read
        is_clean = False
        try:
            data = first
            while data:
                out = annotator.feed(data)
                if out:
                    yield out
                data = await read()
            is_clean = annotator.is_done
            if not is_clean:
                response.error = "the backend closed the stream before [DONE]"
        except _UPSTREAM_ERRORS as exc:
            response.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        finally:
            lease.end(is_clean)
        if response.error is not None:
            self._mark_down(lease.slot, f"died mid-stream ({response.error})")
            yield annotator.finish_with_error(
                f"backend {self.name} failed mid-stream: {response.error}"
            )
        else:
            tail = annotator.finish()
            if tail:
                yield tail


class _Lease:
    """One stream's hold on a server slot and an upstream connection; ``end`` is idempotent."""

    def __init__(self, slot: ServerSlot, resp: UpstreamResponse) -> None:
        self.slot = slot
        self.resp = resp
        self.is_ended = False

    def end(self, is_clean: bool = False) -> None:
        """Free the slot; a clean end returns the connection to the pool, else closes it."""
        if self.is_ended:
            return
        self.is_ended = True
        self.slot.num_inflight -= 1
        if is_clean:
            self.resp.release()
        else:
            self.resp.close()


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
