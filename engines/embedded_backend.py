"""The embedded DFlash engine behind the Backend protocol: k chosen per request per step.

The engine (engines/embedded) generates token ids; this adapter tokenizes the OpenAI request
with the target's chat template, asks the running policy for k before every step (see
controller/step_control.py), and writes OpenAI bodies and SSE chunks itself, the final one
carrying the ``draftctl`` object. torch loads only when the engine does (in ``start``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

from controller.config import EmbeddedBackend
from controller.step_control import RequestSteps, StepControllerFactory
from engines.base import Annotator, BackendRequest, BackendResponse, Outcome
from engines.embedded.events import SamplingParams, TokenEvent
from engines.openai_format import DONE, Detokenizer, ResponseShape, sse, usage
from engines.sse import error_event

log = logging.getLogger(__name__)

_DEFAULT_MAX_TOKENS = 256


class RequestRejected(ValueError):
    """The request cannot run on this engine; the message names the field."""


def _draft_block_size(draft_dir: Path) -> int:
    try:
        return int(json.loads((draft_dir / "config.json").read_text())["block_size"])
    except (OSError, KeyError, ValueError):
        return 16  # until the engine loads and reports it


def _error_body(message: str, param: str | None = None) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return json.dumps({"error": error}).encode()


class EmbeddedEngineBackend:
    kind = "embedded"
    spec_tokens: int | None = None  # k is chosen per request per step

    def __init__(self, config: EmbeddedBackend, step_controllers: StepControllerFactory) -> None:
        self.config = config
        self.name = config.name
        self.model = config.model
        self.block_size = _draft_block_size(config.draft)
        self._step_controllers = step_controllers
        self._engine: Any = None
        self._num_inflight = 0

    def is_healthy(self) -> bool:
        return self._engine is not None

    def num_inflight(self) -> int:
        return self._num_inflight

    async def start(self) -> None:
        from engines.embedded import AsyncEngine  # imports torch

        c = self.config
        for role, folder in (("target", c.target), ("draft", c.draft)):
            if not folder.is_dir():
                raise FileNotFoundError(f"backend {c.name}: {role} directory {folder} not found")
        self._engine = await asyncio.to_thread(
            AsyncEngine.load,
            c.target,
            c.draft,
            c.device,
            c.max_batch_size,
            c.max_seq_len,
            compile_forwards=c.torch_compile,
        )
        self.block_size = self._engine.block_size
        log.info("embedded engine %s loaded on %s", c.name, self._engine.device)

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.close()

    def _prompt_ids(self, request: BackendRequest) -> list[int]:
        tokenizer = self._engine.tokenizer
        if request.endpoint == "chat":
            encoded = tokenizer.apply_chat_template(
                request.body["messages"], add_generation_prompt=True, tokenize=True
            )
            ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
            return list(ids)
        prompt = request.body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if not isinstance(prompt, str):
            raise RequestRejected("'prompt' must be one string or one list of token ids")
        return list(tokenizer.encode(prompt))

    def _params(self, body: dict[str, Any]) -> SamplingParams:
        if body.get("n", 1) != 1:
            raise RequestRejected("'n' must be 1 on the embedded engine")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        stop_ids = self._engine.tokenizer.eos_token_id
        try:
            return SamplingParams(
                max_new_tokens=int(max_tokens or _DEFAULT_MAX_TOKENS),
                temperature=float(body.get("temperature", 1.0)),
                top_p=float(body.get("top_p", 1.0)),
                top_k=max(0, int(body.get("top_k") or 0)),
                stop_token_ids=() if stop_ids is None else (int(stop_ids),),
                seed=body.get("seed"),
            )
        except (TypeError, ValueError) as exc:
            raise RequestRejected(f"invalid sampling parameters: {exc}") from None

    async def submit(
        self, request: BackendRequest, spec_tokens: int, annotate: Annotator
    ) -> BackendResponse:
        try:
            prompt_ids = self._prompt_ids(request)
            params = self._params(request.body)
        except RequestRejected as exc:
            return BackendResponse(400, "application/json", _once(_error_body(str(exc))))
        steps = self._step_controllers(
            request.task, request.confidence, spec_tokens, self.block_size
        )
        events = self._engine.generate(prompt_ids, params, steps, {"task": request.task.value})
        self._num_inflight += 1
        try:
            first = await events.__anext__()  # prefill: a prompt that does not fit fails here
        except ValueError as exc:
            self._num_inflight -= 1
            return BackendResponse(400, "application/json", _once(_error_body(str(exc))))
        except BaseException:
            self._num_inflight -= 1
            raise
        generation = _Generation(self, request, len(prompt_ids), steps, annotate)
        response = BackendResponse(200, "application/json", _once(b""), generation.outcome)
        if request.stream:
            response.media_type = "text/event-stream"
        response.body = generation.run(first, events, response)
        response.release = lambda: generation.release(events)
        return response

    def done(self) -> None:
        self._num_inflight -= 1


class _Generation:
    """One request's token stream -> OpenAI body or chunks, plus its Outcome."""

    def __init__(
        self,
        backend: EmbeddedEngineBackend,
        request: BackendRequest,
        num_prompt: int,
        steps: RequestSteps,
        annotate: Annotator,
    ) -> None:
        self.backend = backend
        self.request = request
        self.num_prompt = num_prompt
        self.steps = steps
        self.annotate = annotate
        self.outcome = Outcome(num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0)
        self.shape = ResponseShape(request.endpoint, request.body["model"])
        stop = request.body.get("stop") or ()
        tokenizer = backend._engine.tokenizer
        self.detok = Detokenizer(
            lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            [stop] if isinstance(stop, str) else list(stop),
        )
        options = request.body.get("stream_options") or {}
        self.wants_usage = bool(options.get("include_usage"))
        self.is_started = False
        self.is_released = False
        self._closing: asyncio.Future[None] | None = None

    def release(self, events: AsyncGenerator[TokenEvent, None]) -> None:
        """The body was closed before it ran: free the slot and abort the engine request."""
        if self.is_started or self.is_released:
            return
        self.is_released = True
        self.backend.done()
        self._closing = asyncio.ensure_future(events.aclose())  # kept: tasks are weakly held

    def _record(self, event: TokenEvent) -> None:
        report = event.report
        if report is None:
            return  # the prefill
        if report.spec_tokens == 0:  # says nothing about acceptance, times the plain step
            self.outcome.plain_step_times_s.append(report.step_time_s)
            return
        o = self.outcome
        o.num_drafts = (o.num_drafts or 0) + 1
        o.num_draft_tokens = (o.num_draft_tokens or 0) + report.spec_tokens
        o.num_accepted_tokens = (o.num_accepted_tokens or 0) + report.accept_length - 1
        for i, accepted in enumerate(report.accepted):
            if len(o.accepted_per_position) <= i:
                o.accepted_per_position.append(0)
            o.accepted_per_position[i] += int(accepted)
        o.accept_lengths.append(report.accept_length)
        o.step_spec_tokens.append(report.spec_tokens)
        o.step_times_s.append(report.step_time_s)

    async def run(
        self,
        first: TokenEvent,
        events: AsyncGenerator[TokenEvent, None],
        response: BackendResponse,
    ) -> AsyncIterator[bytes]:
        self.is_started = True
        finish: str | None = None
        try:
            event: TokenEvent | None = first
            is_first = True
            while event is not None:
                self._record(event)
                delta = self.detok.add(event.token_ids, event.finished)
                finish = "stop" if self.detok.is_stopped else event.finish_reason
                if self.request.stream and (delta or is_first) and not event.finished:
                    yield sse(self.shape.chunk(delta, None, is_first))
                    is_first = False
                if event.finished or self.detok.is_stopped:
                    if self.request.stream:
                        yield self._final(delta, finish or "stop", is_first)
                    break
                event = await events.__anext__()
        except Exception as exc:
            response.error = f"{type(exc).__name__}: {exc}"
            log.warning("embedded request failed mid-stream: %s", response.error)
            if self.request.stream:
                yield error_event(f"backend {self.backend.name} failed: {response.error}")
            return
        finally:
            self.backend.done()
            await events.aclose()  # aborts the request in the engine if it is still running
            self.outcome.num_output_tokens = len(self.detok.ids)
        if not self.request.stream:
            body = self.shape.body(self.detok.text, finish or "stop", self._usage())
            body["draftctl"] = self.annotate(self.outcome)
            yield json.dumps(body).encode()

    def _usage(self) -> dict[str, int]:
        return usage(self.num_prompt, len(self.detok.ids))

    def _final(self, delta: str, finish: str, is_first: bool) -> bytes:
        self.outcome.num_output_tokens = len(self.detok.ids)
        chunk = self.shape.chunk(delta, finish, is_first)
        tail = self.shape.usage_chunk(self._usage()) if self.wants_usage else None
        if tail is None:
            chunk["draftctl"] = self.annotate(self.outcome)
            return sse(chunk) + DONE
        tail["draftctl"] = self.annotate(self.outcome)
        return sse(chunk) + sse(tail) + DONE


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
