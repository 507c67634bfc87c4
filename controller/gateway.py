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

from controller.body_reader import read_body, request_headers
from controller.client_watch import ClientWatch
from controller.config import ServerConfig
from controller.deferred import after_first_byte
from controller.fleet import Fleet
from controller.gateway_stream import GatewayStream
from controller.metrics import Metrics
from controller.openai_errors import (
    ApiError,
    model_not_found,
    no_backend,
    shutting_down,
    timeout_error,
    too_busy,
)
from controller.planner import Plan, Planner
from controller.policy.running import RunningPolicy
from controller.recording import TraceRecorder, request_line
from controller.request_parse import OFF_LOOP_BYTES, TASK_HEADER, ParsedRequest, parse_request
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
from policies.types import served_spec_tokens

log = logging.getLogger(__name__)

_RETRY_AFTER_S = 1  # what a 429 tells the client to wait


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
        recorder: TraceRecorder | None = None,
    ) -> None:
        self.config = config
        self.recorder = recorder  # the served-traffic trace (recording.enabled), or None
        self.fleet = fleet
        self.planner = planner
        self.stats = stats
        self.metrics = metrics
        self.policy = policy
        self.allow_hint = allow_hint
        self.num_inflight = 0  # admitted requests not yet answered (streams: not yet ended)
        self.is_draining = False  # set by the server's shutdown
        self._request_ids = itertools.count(1)
        self._raw_headers: dict[tuple[str, int, str, str], list[tuple[bytes, bytes]]] = {}
        self._timeout_event = error_event(
            f"request ran longer than server.request_timeout_s = {config.request_timeout_s} s "
            "and was stopped",
            code="timeout",
        )
        self.shutdown_event = error_event(
            "draftctl is shutting down and stopped this stream after server.drain_timeout_s "
            f"= {config.drain_timeout_s} s; retry on another instance",
            code="shutting_down",
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
        """One completion request, from the ASGI scope (no Starlette Request on this path).

        It holds one of ``server.max_inflight`` places (429 when none is free) from here
        until its response ends, however it ends: a relayed stream gives its place back when
        its relay finishes, every other request before this returns.
        """
        if self.num_inflight >= self.config.max_inflight:
            return too_busy(self.num_inflight, _RETRY_AFTER_S).response()
        self.num_inflight += 1
        response: Response | None = None
        try:
            response = await self._serve(scope, receive, endpoint)
            return response
        finally:
            if not isinstance(response, GatewayStream):
                self.num_inflight -= 1

    async def _serve(self, scope: Scope, receive: Receive, endpoint: Endpoint) -> Response:
        started_s = time.perf_counter()
        task_header, length_header = request_headers(scope)
        try:
            raw = await read_body(receive, length_header, self.config.max_body_bytes)
            parsed = await self._parse(endpoint, raw, task_header)
            backends = self.fleet.backends_for(parsed.model)
            if not backends:
                raise model_not_found(parsed.model, self.fleet.models())
            plan = self.planner.plan(parsed, backends, self.policy())
            if parsed.is_stream:
                return await self._answer(parsed, plan, started_s)
            return await self._answer_whole(parsed, plan, receive, started_s)
        except ApiError as error:
            return error.response()
        except TimeoutError:
            return timeout_error(self.config.request_timeout_s).response()
        except ClientDisconnect:
            return Response(status_code=499)  # nobody reads it: the client has gone
        except asyncio.CancelledError:
            if not self.is_draining:
                raise
            # server.drain_timeout_s passed: an OpenAI error instead of uvicorn's bare 500.
            return shutting_down().response()

    async def _parse(
        self, endpoint: Endpoint, raw: bytes, task_header: str | None
    ) -> ParsedRequest:
        """A large body is parsed on a worker thread, so other requests keep being served."""
        if len(raw) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(
                parse_request, endpoint, raw, task_header, self.allow_hint
            )
        return parse_request(endpoint, raw, task_header, self.allow_hint)

    async def _answer_whole(
        self, parsed: ParsedRequest, plan: Plan, receive: Receive, started_s: float
    ) -> Response:
        """A non-streaming answer: dropped, backend request and all, if the client leaves."""
        watch = ClientWatch(receive)
        try:
            return await self._answer(parsed, plan, started_s)
        except asyncio.CancelledError:
            if not watch.is_gone:
                raise
            return Response(status_code=499)
        finally:
            watch.stop()

    async def _answer(self, parsed: ParsedRequest, plan: Plan, started_s: float) -> Response:
        async with asyncio.timeout(self.config.request_timeout_s):
            backend, k, response = await self._submit(parsed, plan)
        # From here the response holds a backend slot: _relay or _whole frees it on every path.
        after_first_byte(self._count, plan, backend.name, k)
        if parsed.is_stream and response.status == 200:
            return self._relay(plan, backend, k, response, started_s)
        return await self._whole(plan, backend, k, response, started_s)

    def _relay(
        self, plan: Plan, backend: Backend, k: int, response: BackendResponse, started_s: float
    ) -> Response:
        """The stream, relayed; it gives back its in-flight place and records when it ends."""
        is_done = False

        def done(first_s: float | None, is_timed_out: bool) -> None:
            nonlocal is_done
            if not is_done:
                is_done = True
                self.num_inflight -= 1
                self._finish(plan, backend, k, response, started_s, first_s, is_timed_out)

        try:
            raw = self._stream_headers(plan.task.value, k, backend.name, response.media_type)
        except BaseException:
            _release(response)
            raise
        deadline_s = started_s + self.config.request_timeout_s
        return GatewayStream(
            response.body,
            raw,
            deadline_s,
            self._timeout_event,
            done,
            lambda: self.is_draining,
            self.shutdown_event,
        )

    async def _whole(
        self, plan: Plan, backend: Backend, k: int, response: BackendResponse, started_s: float
    ) -> Response:
        """A whole body: read by submit() already (pools) or generated now (embedded)."""
        deadline_s = started_s + self.config.request_timeout_s
        is_timed_out = False
        try:
            async with asyncio.timeout(max(0.0, deadline_s - time.perf_counter())):
                content = b"".join([chunk async for chunk in response.body])
        except TimeoutError:
            is_timed_out = True
        finally:
            try:
                await _close(response.body)
            finally:
                self._finish(plan, backend, k, response, started_s, None, is_timed_out)
        if is_timed_out:
            return timeout_error(self.config.request_timeout_s).response()
        headers = {
            TASK_HEADER: plan.task.value,
            "x-draftctl-spec-tokens": str(k),
            "x-draftctl-backend": backend.name,
        }
        return Response(content, response.status, headers, response.media_type)

    def _finish(
        self,
        plan: Plan,
        backend: Backend,
        k: int,
        response: BackendResponse,
        started_s: float,
        first_s: float | None,
        is_timed_out: bool,
    ) -> None:
        """Free what the response holds, then record it (a recording bug is logged, only)."""
        try:
            _release(response)
        finally:
            if is_timed_out:
                response.error = "server.request_timeout_s exceeded"
            end_s = time.perf_counter()
            # TPOT from the backend's own decode time (embedded engine, streamed or not), else
            # from streams: first to last chunk spans the decode, not the prefill.
            decode_s = response.outcome.decode_s
            if decode_s is None and first_s is not None:
                decode_s = end_s - first_s
            try:
                self._record(response, plan, backend, k, end_s - started_s, decode_s)
            except Exception:
                log.exception("recording a finished request failed")
            if self.recorder is not None:
                try:
                    line = request_line(plan, backend, k, response, started_s, first_s, end_s)
                    self.recorder.record(line)
                except Exception:
                    log.exception("tracing a finished request failed")

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

    async def _submit(
        self, parsed: ParsedRequest, plan: Plan
    ) -> tuple[Backend, int, BackendResponse]:
        request_id = f"{next(self._request_ids):x}"
        for backend, view in zip(plan.pools, plan.views, strict=True):
            k = served_spec_tokens(view, plan.decision.spec_tokens)
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
        ran = outcome.mean_spec_tokens()
        self.stats.record_k(
            time.time(),
            plan.task,
            float(k) if ran is None else ran,
            outcome.reason or plan.decision.reason,
        )
        if accept is not None:
            self.metrics.set_accept_length(plan.task.value, backend.name, accept)
        try:
            plan.running.learn(plan.task, k, outcome, max(1, plan.concurrency), tpot_s)
        except Exception:
            log.exception("the policy's online models rejected an outcome")
            self.metrics.degraded.labels("learning").inc()


async def _close(body: AsyncIterator[bytes]) -> None:
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        await aclose()


def _release(response: BackendResponse) -> None:
    if response.release is not None:
        response.release()
