"""Async front of the embedded engine, for the gateway and the CLI.

The step loop runs in one background thread. ``spec_controller`` callbacks are called on that
thread before every step, once per running request: they must be fast and must not block
(no I/O, no awaiting); one that raises is logged and that request drafts k = 0 for the step.
Events cross back to the caller's event loop with ``call_soon_threadsafe``.

Failures (docs/engine.md, "Failure isolation"): bad input raises ValueError from ``generate``
before anything is queued; a request that fails inside the engine ends alone, its stream
raising ``RequestFailed``. If the loop itself raises (a bug outside any request), every waiting
stream gets ``RequestFailed`` (stage "engine loop") at once, the engine's bookkeeping is reset
and the loop restarts. ``is_alive()`` and ``seconds_since_progress()`` are the health view.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from engines.embedded.engine import PLAIN_BURST, SPEC_BURST, Engine
from engines.embedded.events import (
    AttentionChoice,
    CompileMode,
    CompileScope,
    LinearChoice,
    RequestFailed,
    SamplingParams,
    SpecController,
    StepPlanner,
    TokenEvent,
    VerifyMode,
)
from engines.embedded.loader import load_runner, resolve_device
from engines.embedded.request import Request
from engines.embedded.synthetic import SyntheticAcceptance

logger = logging.getLogger(__name__)


_Sink = tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]  # a consumer's loop and queue


class EngineClosed(RuntimeError):
    """generate() was called after close(), or the engine stopped mid-request."""


class AsyncEngine:
    def __init__(self, engine: Engine, tokenizer: Any, device: str) -> None:
        self._engine = engine
        self.tokenizer = tokenizer
        self.block_size = engine.block_size
        self.per_row_widths = engine.runner.per_row_widths
        self.device = device
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        # Consumers' streams. The caller's event loop adds and removes them; the engine thread
        # takes them all at once when it must fail every waiting stream.
        self._sinks: dict[str, _Sink] = {}
        self._sinks_lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = False
        self._is_stopped = False  # the loop thread has ended (close, or a BaseException)
        self.num_loop_restarts = 0
        # Health view, written by the engine thread only: idle = waiting for a command with no
        # work; otherwise progress_s is the last completed step or when the work arrived.
        self._is_idle = True
        self._progress_s = time.monotonic()
        self._thread = threading.Thread(target=self._serve, name="draftctl-engine", daemon=True)
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
        synthetic: SyntheticAcceptance | None = None,
        planner: StepPlanner | None = None,
        before_serving: Callable[[Engine], None] | None = None,
        verify_mode: VerifyMode = "ragged",
        compile_scope: CompileScope = "forward",
        attention: AttentionChoice = "auto",
        compile_mode: CompileMode = "default",
        compile_attention_ahead: bool = True,
        linear: LinearChoice = "auto",
        defer_context: bool = True,
        plain_burst: int = PLAIN_BURST,
        spec_burst: int = SPEC_BURST,
        plain_burst_graph: bool = False,
        plain_chain: bool = True,
    ) -> AsyncEngine:
        """Load a target (Qwen3/Llama HF dir with tokenizer) and a DFlash draft dir. Blocking.
        ``synthetic``: benchmark-only drawn acceptance (docs/synthetic.md); never the default.
        ``planner``: chooses k for all rows of each step (else each request's controller).
        ``before_serving``: runs on the loaded, idle engine before its thread starts (the
        start-up cost profile). ``verify_mode``: ``padded`` or ``ragged`` CUDA-graph verifies
        (docs/engine.md, "Ragged verify on CUDA"); ``compile_scope``: what
        ``compile_forwards`` compiles (``forward`` or ``layer``, docs/engine.md); ``attention``: the
        target's attention kernel in steps (``auto``: triton on CUDA where its start-up check
        passes, else sdpa; or ``sdpa`` / ``triton``, docs/engine.md);
        ``compile_mode``: ``default`` or ``max-autotune`` (with ``compile_forwards``);
        ``compile_attention_ahead``: on a CUDA device with the Triton attention, its kernels
        compiled in worker processes before the captures (``ModelRunner``); ``linear``: the
        linear layers' kernel (``auto``: the fused few-token kernel on CUDA, else aten);
        ``defer_context``: on a CUDA device, k = 0 steps stash the draft's context
        (``ModelRunner``); ``plain_burst``: on a CUDA device, plain steps per host round
        trip when every row has k = 0, and ``spec_burst`` for drafting steps
        (``Engine``; elsewhere 1); ``plain_burst_graph``: with CUDA graphs and
        ``defer_context``, a burst of ``plain_burst`` greedy plain steps replays one graph
        holding all of them (``ModelRunner``); ``plain_chain``: on a CUDA device, each
        plain burst queued before the last one is read (``Engine``)."""
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
            synthetic=synthetic,
            verify_mode=verify_mode,
            compile_scope=compile_scope,
            attention=attention,
            compile_mode=compile_mode,
            compile_attention_ahead=None if compile_attention_ahead else False,
            linear=linear,
            defer_context=None if defer_context else False,
            plain_burst_graph=plain_burst if plain_burst_graph else 0,
        )
        tokenizer = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
        cuda = torch_device.type == "cuda"
        engine = Engine(
            runner,
            max_batch_size,
            max_seq_len,
            planner,
            plain_burst=plain_burst if cuda else 1,
            spec_burst=spec_burst if cuda else 1,
            plain_chain=plain_chain and cuda,
        )
        if before_serving is not None:
            before_serving(engine)
        return cls(engine, tokenizer, str(torch_device))

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        spec_controller: SpecController,
        context: dict[str, Any] | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Submit one request and stream its tokens; the last event has ``finished=True``.

        Raises ValueError (naming the field) for a request the engine refuses, before anything
        is queued; EngineClosed after close(); RequestFailed from the stream, in place of the
        next event, when the request fails inside the engine (other requests go on)."""
        if self._closed:
            raise EngineClosed("the engine is closed; create a new AsyncEngine")
        request_id = f"emb-{next(self._ids)}"
        request = Request(request_id, list(prompt_ids), params, spec_controller, context or {})
        self._engine.validate(request)
        sink: asyncio.Queue[Any] = asyncio.Queue()
        with self._sinks_lock:
            if self._is_stopped:
                raise EngineClosed("the engine loop has stopped; create a new AsyncEngine")
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
            with self._sinks_lock:
                self._sinks.pop(request_id, None)
            if not finished:
                self._inbox.put(("abort", request_id))

    def step_counts(self) -> dict[str, tuple[int, int]]:
        """Per kind (plain, drafting): decode steps run and the host round trips they took
        (``Engine.step_counts``; steps per round trip above 1 when bursts run). Read from
        any thread: two integers each, written by the engine thread."""
        return {kind: (c.steps, c.round_trips) for kind, c in self._engine.step_counts.items()}

    def is_alive(self) -> bool:
        """True while the step loop runs; False after close() or once its thread has ended."""
        return not self._closed and self._thread.is_alive()

    def seconds_since_progress(self) -> float:
        """Seconds since the loop last completed a step, counted only while it has work (since
        the work arrived if that is later); 0.0 when idle. Cheap: two attribute reads.

        A watchdog compares it with the longest step it expects (a long prefill included):
        above that the loop is stalled (a hung device call, a blocking controller)."""
        if self._is_idle:
            return 0.0
        return max(0.0, time.monotonic() - self._progress_s)

    async def close(self) -> None:
        """Stop the step loop; requests still running end with EngineClosed."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(("close", None))
        await asyncio.to_thread(self._thread.join)

    # -- engine thread -----------------------------------------------------------------------

    def _serve(self) -> None:
        """Thread body: the loop, restarted after a crash; it ends on close (or BaseException)."""
        try:
            while True:
                try:
                    self._loop()
                    return
                except Exception as exc:  # a bug outside any request: nobody may wait for good
                    self._recover(exc)
        except BaseException:
            logger.critical("engine loop thread ended", exc_info=True)
            raise
        finally:
            with self._sinks_lock:
                self._is_stopped = True
            self._fail_consumers(
                lambda rid: EngineClosed("the engine stopped while the request was running")
            )

    def _recover(self, exc: Exception) -> None:
        """After a crash outside any request: fail every waiting stream, drop all requests."""
        logger.error("engine loop crashed; failing waiting requests, restarting", exc_info=exc)
        self.num_loop_restarts += 1
        message = f"{type(exc).__name__}: {exc} (the engine loop restarted)"
        self._fail_consumers(lambda request_id: RequestFailed(request_id, "engine loop", message))
        self._engine.reset()

    def _loop(self) -> None:
        """Apply commands and step while there is work; return once close is requested."""
        while self._drain_inbox():
            if self._engine.has_work:
                self._deliver_step(self._engine.step())
                self._progress_s = time.monotonic()

    def _drain_inbox(self) -> bool:
        """Apply queued commands, waiting for one while there is no work; False on close."""
        block = not self._engine.has_work
        while True:
            self._is_idle = block
            try:
                command, payload = self._inbox.get(block=block)
            except queue.Empty:
                return True
            if block:  # work arrives now: a stall is counted from here, not from the last step
                self._progress_s = time.monotonic()
                self._is_idle = block = False
            if command == "close":
                return False
            if command == "abort":
                self._engine.abort(payload)
            else:
                self._add(payload)

    def _add(self, request: Request) -> None:
        if request.request_id not in self._sinks:
            return  # its consumer has left, or was failed by a crash: nothing to run for
        try:
            self._engine.add(request)
        except ValueError as exc:
            self._deliver(request.request_id, exc)

    def _fail_consumers(self, error: Callable[[str], BaseException]) -> None:
        """End every waiting stream with ``error(request_id)`` and forget it."""
        with self._sinks_lock:
            sinks, self._sinks = self._sinks, {}
        for request_id, sink in sinks.items():
            _put(sink, error(request_id))

    def _deliver(self, request_id: str, item: Any) -> None:
        sink = self._sinks.get(request_id)
        if sink is not None and not _put(sink, item):
            self._engine.abort(request_id)  # its event loop is closed: nobody reads the stream

    def _deliver_step(self, events: list[tuple[Request, Any]]) -> None:
        """A step's events, in order, with one hand-over per consumer event loop instead of
        one per event: each ``call_soon_threadsafe`` wakes the loop through its self-pipe
        (~5 us of this thread's time on the CPU measured, while the device waits for the
        next step; 64 rows, or a burst's steps, made that a per-step cost)."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Any, str]]] = {}
        for request, event in events:
            sink = self._sinks.get(request.request_id)
            if sink is not None:
                batches.setdefault(sink[0], []).append((sink[1], event, request.request_id))
        for loop, items in batches.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that loop is closed: nobody reads those streams
                for request_id in dict.fromkeys(request_id for _, _, request_id in items):
                    self._engine.abort(request_id)


def _put_all(items: list[tuple[asyncio.Queue[Any], Any, str]]) -> None:
    """On the consumers' event loop: each item into its stream's queue, in order."""
    for queue_, item, _ in items:
        queue_.put_nowait(item)


def _put(sink: _Sink, item: Any) -> bool:
    """Hand ``item`` to the consumer's event loop; False if that loop is closed."""
    loop, queue_ = sink
    try:
        loop.call_soon_threadsafe(queue_.put_nowait, item)
    except RuntimeError:
        return False
    return True
