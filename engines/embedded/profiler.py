"""Verify-cost profiler: T(batch, tokens per request) of one target forward, CUDA-graph replay.

Each point is a target forward of ``tokens`` new tokens per request (LM head included) against
a KV cache holding ``context_len`` positions per request, captured as a CUDA graph and timed
over ``repeats`` replays with CUDA events. The adaptive policy's cost model reads the table.
"""

from __future__ import annotations

import logging

import torch

from engines.embedded.checkpoint import ModelShape
from engines.embedded.cuda_graphs import GraphedCall
from engines.embedded.kv_cache import KVCache
from engines.embedded.target import TargetModel

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]
DEFAULT_TOKENS_PER_REQUEST = [1, 2, 4, 8, 16]


def random_target(
    shape: ModelShape, device: torch.device, dtype: torch.dtype, max_positions: int
) -> TargetModel:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = TargetModel(shape, max_positions, aux_layer_ids=())
    finally:
        torch.set_default_dtype(previous)
    model.fuse()
    return model.eval().requires_grad_(False)


@torch.inference_mode()
def time_forward(
    target: TargetModel, cache: KVCache, batch: int, tokens: int, context_len: int, repeats: int
) -> float:
    """Seconds per forward of ``tokens`` new tokens for ``batch`` requests (graph replay)."""
    device = cache.k.device
    ids = torch.randint(0, target.shape.vocab_size, (batch, tokens), device=device)
    positions = (context_len + torch.arange(tokens, device=device)).repeat(batch, 1)

    def forward(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return target.logits(target(ids, positions, cache)[0])

    graph = GraphedCall(forward, (ids, positions))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.graph.replay()
    start.record()
    for _ in range(repeats):
        graph.graph.replay()
    end.record()
    end.synchronize()
    del graph
    return start.elapsed_time(end) / 1000.0 / repeats


def measure_cost_table(
    shape: ModelShape,
    context_len: int = 1024,
    batch_sizes: list[int] | None = None,
    tokens_per_request: list[int] | None = None,
    repeats: int = 20,
    device: str = "cuda",
) -> list[list[float]]:
    """step_time_s[i][j] for batch_sizes[i] and tokens_per_request[j] (random bf16 weights)."""
    batch_sizes = batch_sizes or DEFAULT_BATCH_SIZES
    tokens_per_request = tokens_per_request or DEFAULT_TOKENS_PER_REQUEST
    if not torch.cuda.is_available():
        raise ValueError("the cost profiler times CUDA graphs: run it on a CUDA machine")
    dev, dtype = torch.device(device), torch.bfloat16
    cache_len = context_len + max(tokens_per_request)
    target = random_target(shape, dev, dtype, cache_len)
    cache = KVCache(
        shape.num_layers,
        max(batch_sizes),
        shape.num_kv_heads,
        cache_len,
        shape.head_dim,
        dtype,
        dev,
    )
    table = []
    for batch in batch_sizes:
        row = [
            time_forward(target, cache, batch, t, context_len, repeats) for t in tokens_per_request
        ]
        logger.info("batch %d: %s ms", batch, [round(s * 1e3, 2) for s in row])
        table.append(row)
    del target, cache
    torch.cuda.empty_cache()
    return table


def cost_table_document(
    name: str,
    device_name: str,
    context_len: int,
    batch_sizes: list[int],
    tokens_per_request: list[int],
    table: list[list[float]],
    command: str,
) -> dict[str, object]:
    """The cost-table JSON the adaptive policy reads (keys fixed)."""
    return {
        "shape": name,
        "device": device_name,
        "unit": "s",
        "context_len": context_len,
        "batch_sizes": batch_sizes,
        "tokens_per_request": tokens_per_request,
        "step_time_s": table,
        "command": command,
    }
