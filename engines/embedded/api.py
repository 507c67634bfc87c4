"""Async front of the embedded engine, for the gateway and the CLI.

The step loop runs in one background thread. ``spec_controller`` callbacks are called on that
thread before every step, once per running request: they must be fast and must not block
(no I/O, no awaiting); one that raises is logged and that request drafts k = 0 for the step.
Events cross back to the caller's event loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams, SpecController, TokenEvent
from engines.embedded.loader import load_runner, resolve_device
from engines.embedded.request import Request

logger = logging.getLogger(__name__)


class EngineClosed(RuntimeError):
    """generate() was called after close(), or the engine stopped mid-request."""


class AsyncEngine:
    def __init__(self, engine: Engine, tokenizer: Any, device: str) -> None:
        self._engine = engine
        self.tokenizer = tokenizer
        self.block_size = engine.block_size
        self.device = device
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._ids = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="draftctl-engine", daemon=True)
        self._thread.start()

    @classmethod
    def load(
        cls,
        target_dir: str | Path,
        draft_dir: str | Path,
        device: str = "auto",
        max_batch_size: int = 8,
        max_seq_len: int = 2048,
        use_cuda_graphs: bool | None = None,
        compile_forwards: bool = False,
    ) -> AsyncEngine:
        """Load a target (Qwen3/Llama HF dir with tokenizer) and a DFlash draft dir. Blocking."""
        from transformers import AutoTokenizer

        torch_device = resolve_device(device)
        runner = load_runner(
            Path(target_dir),
            Path(draft_dir),
            torch_device,
            max_batch_size,
            max_seq_len,
            use_cuda_graphs,
            compile_forwards=compile_forwards,
        )
        tokenizer = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
        return cls(Engine(runner, max_batch_size, max_seq_len), tokenizer, str(torch_device))

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        spec_controller: SpecController,
        context: dict[str, Any] | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Submit one request and stream its tokens; the last event has ``finished=True``.

        Raises ValueError for a prompt that does not fit, EngineClosed after close()."""
        if self._closed:
            raise EngineClosed("the engine is closed; create a new AsyncEngine")
        request_id = f"emb-{next(self._ids)}"
        request = Request(request_id, list(prompt_ids), params, spec_controller, context or {})
        sink: asyncio.Queue[Any] = asyncio.Queue()
        self._sinks[request_id] = (asyncio.get_running_loop(), sink)
        self._inbox.put(("add", request))
        finished = False
        try:
            while not finished:
                item = await sink.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._sinks.pop(request_id, None)
            if not finished:
                self._inbox.put(("abort", request_id))

    async def close(self) -> None:
        """Stop the step loop; requests still running end with EngineClosed."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(("close", None))
        await asyncio.to_thread(self._thread.join)

    # -- engine thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            if not self._drain_inbox(block=not self._engine.has_work):
                break
            if not self._engine.has_work:
                continue
            try:
                events = self._engine.step()
            except Exception as exc:  # a failed step fails its requests, not the engine
                logger.exception("engine step failed")
                self._fail_all(exc)
                continue
            for request, event in events:
                self._deliver(request.request_id, event)
        self._fail_all(EngineClosed("the engine was closed while the request was running"))

    def _drain_inbox(self, block: bool) -> bool:
        """Apply queued commands; False once close was requested."""
        while True:
            try:
                command, payload = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if command == "close":
                return False
            if command == "abort":
                self._engine.abort(payload)
            else:
                self._add(payload)

    def _add(self, request: Request) -> None:
        try:
            self._engine.add(request)
        except ValueError as exc:
            self._deliver(request.request_id, exc)

    def _fail_all(self, exc: BaseException) -> None:
        for request in [*self._engine.scheduler.running, *self._engine.scheduler.waiting]:
            self._engine.abort(request.request_id)
            self._deliver(request.request_id, exc)

    def _deliver(self, request_id: str, item: Any) -> None:
        target = self._sinks.get(request_id)
        if target is not None:
            loop, sink = target
            loop.call_soon_threadsafe(sink.put_nowait, item)
