"""The embedded DFlash engine behind the Backend protocol: k chosen per request per step.

The engine (engines/embedded) generates token ids; this adapter tokenizes the OpenAI request
with the target's chat template, asks the running policy for k before every step through its
``StepController`` (engines/step_controller.py), and writes OpenAI bodies and SSE chunks
itself, the final one carrying the ``draftctl`` object. torch loads only when the engine
does (in ``start``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

from engines.base import Annotator, BackendRequest, BackendResponse, Outcome
from engines.config import EmbeddedConfig
from engines.embedded.events import RequestFailed, SamplingParams, TokenEvent
from engines.openai_format import (
    DONE,
    Detokenizer,
    MessageError,
    ResponseShape,
    error_object,
    sse,
    template_messages,
    usage,
)
from engines.sse import error_event
from engines.step_controller import RequestSteps, StepController, StepPolicySource
from policies.types import max_spec_tokens

log = logging.getLogger(__name__)

_DEFAULT_MAX_TOKENS = 256


# Prompts longer than this (characters) are tokenized on a worker thread, so a large body does
# not hold up the event loop (and every other request) while it is encoded.
_OFF_LOOP_CHARS = 32_000


class RequestRejected(ValueError):
    """The request cannot run on this engine; the message names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _max_prompt_chars(tokenizer: Any, max_seq_len: int) -> int:
    """Characters past which a prompt cannot fit ``max_seq_len`` tokens, whatever it says.

    One token stands for at most as many characters as its vocabulary entry has (byte-level
    BPE writes one character per byte, SentencePiece the piece itself), so a text of N
    characters is at least N / longest-entry tokens. A normalizer may compose characters
    (NFC turns "e" + U+0301 into one): then a factor of 4 keeps the bound safe.
    """
    longest = max(len(entry) for entry in tokenizer.get_vocab())
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    return max_seq_len * longest * (1 if normalizer is None else 4)


def _draft_block_size(draft_dir: Path) -> int:
    try:
        return int(json.loads((draft_dir / "config.json").read_text())["block_size"])
    except (OSError, KeyError, ValueError):
        return 16  # until the engine loads and reports it


def _error_body(message: str, param: str | None = None) -> bytes:
    return json.dumps(error_object(message, param=param)).encode()


def _failure_body(message: str) -> bytes:
    return json.dumps(error_object(message, "server_error", code="engine_error")).encode()


def _prompt_chars(body: dict[str, Any]) -> int:
    """About how many characters tokenizing ``body`` reads (cheap; no deep walk)."""
    text = body.get("prompt", body.get("messages"))
    if isinstance(text, str):
        return len(text)
    if isinstance(text, list):
        return sum(len(str(item)) if not isinstance(item, int) else 1 for item in text)
    return 0


class EmbeddedEngineBackend:
    kind = "embedded"
    is_adjustable = True  # k is chosen per request per step

    def __init__(self, config: EmbeddedConfig, policy_source: StepPolicySource) -> None:
        self.config = config
        self.name = config.name
        self.model = config.model
        self.steps = StepController(policy_source, _draft_block_size(config.draft))
        self._engine: Any = None
        self._num_inflight = 0
        # Longer prompts are refused before tokenizing: a 4 MB body took ~6 s of CPU to
        # tokenize and left ~0.5 GB in the worker thread's heap (RSS never came back).
        self._max_prompt_chars = 0

    @property
    def block_size(self) -> int:
        return self.steps.block_size

    @property
    def max_spec_tokens(self) -> int:
        return max_spec_tokens(self.block_size)

    def is_healthy(self) -> bool:
        """Loaded, its loop alive, and not stalled: work pending without a finished step for
        ``stall_timeout_s`` turns the backend not-ready (``/readyz``, ``draftctl_backend_up``)."""
        engine = self._engine
        return (
            engine is not None
            and engine.is_alive()
            and engine.seconds_since_progress() < self.config.stall_timeout_s
        )

    def num_inflight(self) -> int:
        return self._num_inflight

    def step_counts(self) -> dict[str, tuple[int, int]]:
        """The engine's decode steps and host round trips per kind (empty before it loads)."""
        engine = self._engine
        return {} if engine is None else engine.step_counts()

    def num_servers(self) -> int:
        return 1  # one engine; its batch is the load

    async def start(self) -> None:
        c = self.config
        began = time.perf_counter()
        from engines.embedded import AsyncEngine  # imports torch
        from engines.embedded.compile_cache import use_compile_cache

        # (a first start's time goes to imports, the load, compiles and captures: the log says
        # which; bench/daemon_start.py reads these lines)
        log.info(
            "backend %s: engine modules imported in %.1f s", c.name, time.perf_counter() - began
        )
        for role, folder in (("target", c.target), ("draft", c.draft)):
            if not folder.is_dir():
                raise FileNotFoundError(f"backend {c.name}: {role} directory {folder} not found")
        if c.torch_compile and c.compile_cache_dir is not None:
            caches = use_compile_cache(c.compile_cache_dir)
            log.info("backend %s: compile caches %s", c.name, caches)
        self._engine = await asyncio.to_thread(
            AsyncEngine.load,
            c.target,
            c.draft,
            c.device,
            c.max_batch_size,
            c.max_seq_len,
            compile_forwards=c.torch_compile,
            compile_scope=c.torch_compile_scope,
            compile_mode=c.torch_compile_mode,
            verify_mode=c.verify_mode,
            attention=c.attention,
            compile_attention_ahead=c.compile_attention_ahead,
            linear=c.linear,
            defer_context=c.defer_context,
            plain_burst=c.plain_burst,
            spec_burst=c.spec_burst,
            plain_burst_graph=c.plain_burst_graph,
            plain_chain=c.plain_chain,
            planner=self.steps,
            before_serving=self._profile_costs if c.cost_profile else None,
        )
        self.steps.block_size = self._engine.block_size
        self.steps.ragged = self._engine.per_row_widths  # goodput's step_mode "engine"
        self._max_prompt_chars = _max_prompt_chars(self._engine.tokenizer, c.max_seq_len)
        log.info("embedded engine %s loaded on %s", c.name, self._engine.device)

    def _profile_costs(self, engine: Any) -> None:
        """The engine's step costs, cached or measured now (engines/embedded/step_profile.py)."""
        from engines.embedded.step_profile import cache_key, cached_or_profiled

        c = self.config
        device = str(engine.runner.device)
        # Known before the table is offered: a ragged engine's table prices every k.
        self.steps.ragged = engine.runner.per_row_widths
        # Bursts change what a step costs: part of what the table depends on.
        kernels = {
            **engine.runner.kernel_settings(),
            "plain_burst": engine.plain_burst,
            "spec_burst": engine.spec_burst,
        }
        key = cache_key(c.target, c.draft, device, c.max_batch_size, c.max_seq_len, kernels)
        describe = {"target": str(c.target), "draft": str(c.draft), "device": device, **kernels}
        table, origin = cached_or_profiled(
            engine, key, c.cost_cache_dir, c.max_batch_size, describe
        )
        self.steps.offer_cost_table(table)
        widths = ", ".join(
            f"{w}: {1e3 * t:.1f} ms"
            for w, t in zip(table.tokens_per_request, table.step_time_s[0], strict=True)
        )
        log.info("embedded engine %s step costs (%s); batch 1 by width: %s", c.name, origin, widths)

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.close()

    def _prompt_ids(self, request: BackendRequest) -> list[int]:
        tokenizer = self._engine.tokenizer
        if request.endpoint == "chat":
            try:
                messages = template_messages(request.body["messages"])
            except MessageError as exc:
                raise RequestRejected(str(exc), exc.param) from None
            self._check_length(sum(len(m["content"]) for m in messages), "messages")
            encoded = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
            ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
            return list(ids)
        prompt = request.body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if not isinstance(prompt, str):
            raise RequestRejected(
                "'prompt' must be one string or one list of token ids on the embedded engine",
                "prompt",
            )
        self._check_length(len(prompt), "prompt")
        return list(tokenizer.encode(prompt))

    def _check_length(self, num_chars: int, param: str) -> None:
        if num_chars > self._max_prompt_chars:
            raise RequestRejected(
                f"'{param}' holds {num_chars} characters, more than the {self._max_prompt_chars} "
                f"that can fit max_seq_len = {self.config.max_seq_len} tokens of {self.name}; "
                "shorten the prompt",
                param,
            )

    def _params(self, body: dict[str, Any]) -> SamplingParams:
        if body.get("n", 1) != 1:
            raise RequestRejected("'n' must be 1 on the embedded engine", "n")
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
            if _prompt_chars(request.body) > _OFF_LOOP_CHARS:
                prompt_ids = await asyncio.to_thread(self._prompt_ids, request)
            else:
                prompt_ids = self._prompt_ids(request)
            params = self._params(request.body)
        except RequestRejected as exc:
            body = _error_body(str(exc), exc.param)
            return BackendResponse(400, "application/json", _once(body))
        steps = self.steps.start(request.task, request.confidence, spec_tokens)
        events = self._engine.generate(prompt_ids, params, steps, {"task": request.task.value})
        self._num_inflight += 1
        try:
            first = await events.__anext__()  # prefill: a prompt that does not fit fails here
        except ValueError as exc:  # refused at submit: the message names the field
            self._num_inflight -= 1
            return BackendResponse(400, "application/json", _once(_error_body(str(exc))))
        except RequestFailed as exc:  # failed inside the engine (prefill), this request alone
            self._num_inflight -= 1
            log.warning("embedded request failed at prefill: %s", exc)
            body = _failure_body(f"backend {self.name} failed: {exc}")
            return BackendResponse(500, "application/json", _once(body))
        except BaseException:
            self._num_inflight -= 1
            raise
        try:
            generation = _Generation(self, request, len(prompt_ids), steps, annotate)
        except BaseException:
            self._num_inflight -= 1
            await events.aclose()  # aborts the request in the engine
            raise
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
        # The engine's step controller feeds the policy's online models step by step.
        self.outcome = Outcome(
            num_prompt_tokens=num_prompt,
            num_drafts=0,
            num_draft_tokens=0,
            num_accepted_tokens=0,
            is_learned=True,
        )
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
        first_s = time.perf_counter()  # the first token (the prefill's) has just arrived
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
            message = f"backend {self.backend.name} failed: {response.error}"
            if self.request.stream:
                yield error_event(message)
            else:  # the status is read after the whole body (controller/gateway.py _whole)
                response.status = 500
                response.media_type = "application/json"
                yield _failure_body(message)
            return
        finally:
            self.backend.done()
            await events.aclose()  # aborts the request in the engine if it is still running
            self.outcome.num_output_tokens = len(self.detok.ids)
            self.outcome.decode_s = time.perf_counter() - first_s
            self.outcome.reason = self.backend.steps.last_reason or None
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
