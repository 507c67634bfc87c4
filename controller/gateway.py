"""The OpenAI-compatible request path: parse, plan, forward with retry, stream back.

Response headers ``x-draftctl-task``, ``x-draftctl-spec-tokens`` and ``x-draftctl-backend``
say what happened; the ``draftctl`` object in the body (or the final streamed chunk) adds
confidence, the policy's reason and the request's acceptance where the backend reports it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope

from controller.config import ServerConfig
from controller.deferred import after_first_byte
from controller.fleet import Fleet
from controller.metrics import Metrics
from controller.openai_errors import (
    ApiError,
    bad_request,
    body_too_large,
    model_not_found,
    no_backend,
    timeout_error,
)
from controller.planner import Plan, Planner
from controller.policy_state import RunningPolicy
from controller.relay_response import RelayResponse
from controller.request_parse import TASK_HEADER, ParsedRequest, check_length, parse_request
from controller.stats import LiveStats
from engines.base import (
    Backend,
    BackendRequest,
    BackendResponse,
    BackendUnavailable,
    Endpoint,
    Outcome,
)
from engines.sse import error_event
from policies.routing import served_spec_tokens

log = logging.getLogger(__name__)


class Gateway:
    def __init__(
        self,
        config: ServerConfig,
        fleet: Fleet,
        planner: Planner,
        stats: LiveStats,
        metrics: Metrics,
        policy: Callable[[], RunningPolicy],
        allow_hint: bool,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.planner = planner
        self.stats = stats
        self.metrics = metrics
        self.policy = policy
        self.allow_hint = allow_hint
        self.num_inflight = 0
        self._request_ids = itertools.count(1)
        self._raw_headers: dict[tuple[str, int, str, str], list[tuple[bytes, bytes]]] = {}
        self._timeout_event = error_event(
            f"request ran longer than server.request_timeout_s = {config.request_timeout_s} s "
            "and was stopped",
            code="timeout",
        )

    async def chat(self, request: Request) -> Response:
        return await self.serve(request.scope, request.receive, "chat")

    async def completions(self, request: Request) -> Response:
        return await self.serve(request.scope, request.receive, "completion")

    async def models(self, request: Request) -> Response:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "draftctl"}
            for m in self.fleet.models()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def serve(self, scope: Scope, receive: Receive, endpoint: Endpoint) -> Response:
        """One completion request, from the ASGI scope (no Starlette Request on this path)."""
        started_s = time.perf_counter()
        task_header, length_header = _request_headers(scope)
        try:
            parsed = parse_request(
                endpoint,
                await self._read_body(receive, length_header),
                task_header,
                self.allow_hint,
            )
            backends = self.fleet.backends_for(parsed.model)
            if not backends:
                raise model_not_found(parsed.model, self.fleet.models())
            plan = self.planner.plan(parsed, backends, self.policy())
            async with asyncio.timeout(self.config.request_timeout_s):
                backend, k, response = await self._submit(parsed, plan)
        except ApiError as error:
            return error.response()
        except TimeoutError:
            return timeout_error(self.config.request_timeout_s).response()
        return await self._respond(parsed, plan, backend, k, response, started_s)

    async def _respond(
        self,
        parsed: ParsedRequest,
        plan: Plan,
        backend: Backend,
        k: int,
        response: BackendResponse,
        started_s: float,
    ) -> Response:
        """Count the request, then relay the stream or send the whole body; record at the end."""
        after_first_byte(self._count, plan, backend.name, k)
        self.num_inflight += 1
        deadline_s = started_s + self.config.request_timeout_s

        def done(first_s: float | None, is_timed_out: bool) -> None:
            self.num_inflight -= 1
            if response.release is not None:
                response.release()
            if is_timed_out:
                response.error = "server.request_timeout_s exceeded"
            end_s = time.perf_counter()
            # TPOT only from streams: first to last chunk spans the decode, not the prefill.
            decode_s = end_s - first_s if first_s is not None else None
            self._record(response, plan, backend, k, end_s - started_s, decode_s)

        if parsed.is_stream and response.status == 200:
            raw = self._stream_headers(plan.task.value, k, backend.name, response.media_type)
            return RelayResponse(response.body, raw, deadline_s, self._timeout_event, done)
        headers = {
            TASK_HEADER: plan.task.value,
            "x-draftctl-spec-tokens": str(k),
            "x-draftctl-backend": backend.name,
        }
        return await self._whole(response, headers, deadline_s, done)

    def _count(self, plan: Plan, backend: str, k: int) -> None:
        self.metrics.count_request(plan.task.value, backend, k)
        self.stats.record_decision(plan.task, plan.confidence, backend, k)

    def _stream_headers(
        self, task: str, k: int, backend: str, media_type: str
    ) -> list[tuple[bytes, bytes]]:
        """Encoded headers of a relayed stream, built once per (task, k, backend, type)."""
        key = (task, k, backend, media_type)
        raw = self._raw_headers.get(key)
        if raw is None:
            headers = {
                TASK_HEADER: task,
                "x-draftctl-spec-tokens": str(k),
                "x-draftctl-backend": backend,
                "cache-control": "no-cache",
            }
            raw = Response(None, 200, headers, media_type).raw_headers
            raw = self._raw_headers[key] = [h for h in raw if h[0] != b"content-length"]
        return raw

    async def _whole(
        self,
        response: BackendResponse,
        headers: dict[str, str],
        deadline_s: float,
        done: Callable[[float | None, bool], None],
    ) -> Response:
        """A whole body: read by submit() already (pools) or generated now (embedded)."""
        is_timed_out = False
        try:
            async with asyncio.timeout(max(0.0, deadline_s - time.perf_counter())):
                content = b"".join([chunk async for chunk in response.body])
        except TimeoutError:
            is_timed_out = True
        finally:
            await _close(response.body)
            done(None, is_timed_out)
        if is_timed_out:
            return timeout_error(self.config.request_timeout_s).response()
        return Response(content, response.status, headers, response.media_type)

    async def _read_body(self, receive: Receive, length_header: str | None) -> bytes:
        limit = self.config.max_body_bytes
        check_length(length_header, limit)
        chunks: list[bytes] = []
        size = 0
        more_body = True
        while more_body:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            more_body = message.get("more_body", False)
            size += len(chunk)
            if size > limit:
                raise body_too_large(size, limit)
            chunks.append(chunk)
        if not size:
            raise bad_request("Request body is empty; send a JSON object")
        return b"".join(chunks)

    async def _submit(
        self, parsed: ParsedRequest, plan: Plan
    ) -> tuple[Backend, int, BackendResponse]:
        request_id = f"{next(self._request_ids):x}"
        for backend, view in zip(plan.pools, plan.views, strict=True):
            k = served_spec_tokens(view, plan.decision, plan.adjustable)
            backend_request = BackendRequest(
                parsed.endpoint,
                parsed.body,
                parsed.is_stream,
                plan.task,
                request_id,
                plan.confidence,
                parsed.raw,
            )
            annotate = self._annotator(plan, backend, k)
            try:
                return backend, k, await backend.submit(backend_request, k, annotate)
            except BackendUnavailable as exc:
                log.warning("backend %s unavailable, trying the next pool: %s", backend.name, exc)
                self.metrics.errors.labels(backend.name, "before_first_byte").inc()
                self.stats.record_error(backend.name)
        raise no_backend(parsed.model)

    def _annotator(
        self, plan: Plan, backend: Backend, k: int
    ) -> Callable[[Outcome], dict[str, Any]]:
        def annotate(outcome: Outcome) -> dict[str, Any]:
            return {
                "task": plan.task.value,
                "task_source": plan.task_source,
                "confidence": round(plan.confidence, 4),
                "spec_tokens": k,
                "backend": backend.name,
                "reason": plan.decision.reason,
                "accept_length": outcome.mean_accept_length,
                "num_drafts": outcome.num_drafts,
                "num_accepted_tokens": outcome.num_accepted_tokens,
            }

        return annotate

    def _record(
        self,
        response: BackendResponse,
        plan: Plan,
        backend: Backend,
        k: int,
        total_s: float,
        decode_s: float | None,
    ) -> None:
        self.metrics.request_seconds.observe(total_s)
        if response.error is not None:
            self.metrics.errors.labels(backend.name, "mid_stream").inc()
            self.stats.record_error(backend.name)
        outcome = response.outcome
        tpot_s = None
        if decode_s and outcome.num_output_tokens and outcome.num_output_tokens > 1:
            tpot_s = decode_s / (outcome.num_output_tokens - 1)
        accept = self.stats.record_outcome(
            time.monotonic(), plan.task, backend.name, outcome, tpot_s
        )
        if accept is not None:
            self.metrics.set_accept_length(plan.task.value, backend.name, accept)
        try:
            plan.running.learn(plan.task, k, outcome, max(1, plan.concurrency), tpot_s)
        except Exception:
            log.exception("the policy's online models rejected an outcome")
            self.metrics.degraded.labels("learning").inc()


_TASK_HEADER = TASK_HEADER.encode()


def _request_headers(scope: Scope) -> tuple[str | None, str | None]:
    """(x-draftctl-task, content-length) from the ASGI scope's lower-cased raw headers."""
    task = length = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = value.decode("latin-1")
        elif name == _TASK_HEADER:
            task = value.decode("latin-1")
    return task, length


async def _close(body: AsyncIterator[bytes]) -> None:
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        await aclose()
