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
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch


class StaticCall:
    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        static_inputs: tuple[torch.Tensor, ...],
        pool: Any = None,
    ) -> None:
        self.fn, self.static_inputs = fn, static_inputs

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
    ) -> None:
        super().__init__(fn, static_inputs)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: lazy inits and autotuning happen outside the graph
                fn(*static_inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with keep_allocator_cache(), torch.cuda.graph(self.graph, pool=pool):
            self.output = fn(*static_inputs)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        self._copy_inputs(inputs)
        self.graph.replay()
        return self.output

    def again(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


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
