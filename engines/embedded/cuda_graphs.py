"""Capture a function of fixed-shape tensors once and replay it (CUDA only).

Set-up (warm-up, capture) happens at engine start; the hot path only copies inputs into the
static buffers and replays. All graphs share one memory pool; outputs are valid until the next
replay of any graph, so callers consume them first.

``StaticCall`` is the same contract without the graph: inputs are copied into the same static
buffers and the function runs eagerly on them, so the fixed-shape path (padding, whole-cache
attention, static index buffers) runs, and is tested, on the CPU.

``torch.cuda.graph`` empties the allocator's cache on entry to every capture (and the host
cache): a runner capturing ~200 graphs would give its warm-up memory back to the driver and
allocate it again each time. ``keep_allocator_cache`` skips that, as vLLM's capture does after
its first graph; a runner empties the cache once before its first capture instead.

Warm-ups: each graph's function runs ``warmups`` times on a side stream before its capture
(lazy initialisation, a kernel's first compile and load, inductor's autotuning: none of them
may happen inside a capture). Every capture waits for the device first (``torch.cuda.graph``
synchronises on entry), so a runner capturing ~200 graphs pays each warm-up's host time and,
for the large graphs, its device time. The warm-ups share one side stream per device (a new
stream per graph would also give cuBLAS a new workspace per graph).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch


class StaticCall:
    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        static_inputs: tuple[torch.Tensor, ...],
        pool: Any = None,
        warmups: int = 1,
    ) -> None:
        """``pool`` and ``warmups``: ``GraphedCall``'s (no graph here, nothing to warm up)."""
        self.fn, self.static_inputs = fn, static_inputs
        # A graph's set-up seconds by stage (``GraphedCall``; none here): ``warmup`` queueing
        # the warm-ups (host), ``wait`` the device finishing them, ``record`` the capture's
        # forward (host), ``end`` ending the capture (instantiating the graph).
        self.setup_s: dict[str, float] = {}

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        self._copy_inputs(inputs)
        return self.fn(*self.static_inputs)

    def again(self) -> torch.Tensor:
        """Run once more on the inputs already in the static buffers (timing)."""
        return self.fn(*self.static_inputs)

    def _copy_inputs(self, inputs: tuple[torch.Tensor, ...]) -> None:
        # Rows past an input's own (the padded batch) keep what an earlier call left there.
        for static, value in zip(self.static_inputs, inputs, strict=True):
            static[: value.shape[0]].copy_(value)


class GraphedCall(StaticCall):
    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        static_inputs: tuple[torch.Tensor, ...],
        pool: Any = None,
        warmups: int = 1,
    ) -> None:
        if warmups < 1:
            raise ValueError(
                f"warmups={warmups}: a graph needs at least one warm-up (a kernel compiled or "
                "loaded inside a capture invalidates it)"
            )
        super().__init__(fn, static_inputs)
        started = time.perf_counter()
        stream = warmup_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmups):  # lazy inits and autotuning happen outside the graph
                fn(*static_inputs)
        torch.cuda.current_stream().wait_stream(stream)
        queued = time.perf_counter()
        torch.cuda.synchronize()  # what the capture's entry does anyway: timed on its own
        waited = time.perf_counter()
        self.graph = torch.cuda.CUDAGraph()
        with keep_allocator_cache():
            with torch.cuda.graph(self.graph, pool=pool):
                self.output = fn(*static_inputs)
                recorded = time.perf_counter()
            ended = time.perf_counter()
        self.setup_s = {
            "warmup": queued - started,
            "wait": waited - queued,
            "record": recorded - waited,
            "end": ended - recorded,
        }

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        self._copy_inputs(inputs)
        self.graph.replay()
        return self.output

    def again(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


def setup_seconds(calls: Iterable[StaticCall]) -> dict[str, float]:
    """The calls' ``setup_s`` summed by stage (empty for calls without a graph)."""
    total: dict[str, float] = {}
    for call in calls:
        for stage, seconds in call.setup_s.items():
            total[stage] = total.get(stage, 0.0) + seconds
    return total


_WARMUP_STREAMS: dict[int, torch.cuda.Stream] = {}


def warmup_stream() -> torch.cuda.Stream:
    """The current device's side stream for graph warm-ups (created once)."""
    device = torch.cuda.current_device()
    if device not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[device] = torch.cuda.Stream()
    return _WARMUP_STREAMS[device]


@contextlib.contextmanager
def keep_allocator_cache() -> Iterator[None]:
    """Inside: ``torch.cuda.empty_cache`` and the host allocator's ``_host_emptyCache`` do
    nothing (what ``torch.cuda.graph`` calls on entry). Restored on exit, also on errors."""
    saved_device = torch.cuda.empty_cache
    saved_host = getattr(torch._C, "_host_emptyCache", None)

    def skip() -> None:
        return None

    torch.cuda.empty_cache = skip
    if saved_host is not None:
        torch._C._host_emptyCache = skip
    try:
        yield
    finally:
        torch.cuda.empty_cache = saved_device
        if saved_host is not None:
            torch._C._host_emptyCache = saved_host


def padded_size(value: int, sizes: list[int]) -> int:
    """Smallest captured size >= value."""
    for size in sizes:
        if size >= value:
            return size
    raise ValueError(f"{value} exceeds the largest captured size {sizes[-1]}")
