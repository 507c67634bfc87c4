"""Build the runner from checkpoint directories (or from shapes with random weights)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from engines.embedded.checkpoint import (
    DraftSpec,
    ModelShape,
    draft_spec,
    load_weights,
    target_shape,
)
from engines.embedded.draft import DraftModel
from engines.embedded.events import (
    AttentionChoice,
    CompileMode,
    CompileScope,
    LinearChoice,
    VerifyMode,
)
from engines.embedded.runner import ModelRunner
from engines.embedded.synthetic import SyntheticAcceptance
from engines.embedded.target import TargetModel

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device={device!r}: use auto, cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: CUDA is not available here; use --device cpu")
    return torch.device(device)


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA, fp32 on CPU (tests and demos compare against fp32 references)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def build_models(
    shape: ModelShape,
    spec: DraftSpec,
    device: torch.device,
    dtype: torch.dtype,
    max_positions: int,
    target_weights: dict[str, torch.Tensor] | None = None,
    draft_weights: dict[str, torch.Tensor] | None = None,
) -> tuple[TargetModel, DraftModel]:
    """Models on ``device``; without weights they keep PyTorch's random init (benchmarks)."""
    # Parameters are created directly in ``dtype`` (a 32B model would not fit in fp32 first);
    # the rotary tables are computed in fp32 explicitly and cast per use, as transformers does.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            target = TargetModel(shape, max_positions, spec.target_layer_ids)
            draft = DraftModel(spec, max_positions)
    finally:
        torch.set_default_dtype(previous)
    if target_weights is not None:
        target.load_checkpoint(target_weights)
    if draft_weights is not None:
        draft.load_checkpoint(draft_weights)
    target.fuse()
    draft.fuse()
    return target.eval().requires_grad_(False), draft.eval().requires_grad_(False)


def load_runner(
    target_dir: Path,
    draft_dir: Path,
    device: torch.device,
    max_batch_size: int,
    max_seq_len: int,
    use_cuda_graphs: bool | None = None,
    dtype: torch.dtype | None = None,
    compile_forwards: bool = False,
    synthetic: SyntheticAcceptance | None = None,
    verify_mode: VerifyMode = "ragged",
    compile_scope: CompileScope = "forward",
    attention: AttentionChoice = "auto",
    compile_mode: CompileMode = "default",
    compile_attention_ahead: bool | None = None,
    graph_warmups: int = 1,
    linear: LinearChoice = "auto",
    defer_context: bool | None = None,
    plain_burst_graph: int = 0,
) -> ModelRunner:
    """``synthetic``: benchmark-only drawn acceptance (engines/embedded/synthetic.py).
    ``verify_mode``: how CUDA-graph verifies run (default ragged: each row at its own width,
    ragged buckets slower than the padded graph dropped at start-up; no effect without CUDA
    graphs, where steps are packed anyway); ``compile_scope``: what ``compile_forwards``
    compiles and ``compile_mode`` how; ``attention``: the target's attention kernel
    (``auto``: triton on CUDA where its start-up check passes, else sdpa; ``ModelRunner``);
    ``compile_attention_ahead``: ``ModelRunner``'s (the Triton attention's kernels compiled
    in worker processes before the captures); ``graph_warmups``: ``ModelRunner``'s (runs of each
    graph's forward before its capture); ``linear``: ``ModelRunner``'s (the linear layers'
    kernel, ``aten``, ``gemv``, ``fused`` or ``auto``: fused on CUDA); ``defer_context``:
    ``ModelRunner``'s (k = 0 steps stash the draft's context, inserted before the row
    drafts; default: on CUDA); ``plain_burst_graph``: ``ModelRunner``'s (steps of a plain
    burst held in one graph; 0: none)."""
    shape = target_shape(Path(target_dir))
    spec = draft_spec(Path(draft_dir), shape)
    dtype = dtype or default_dtype(device)
    max_positions = max_seq_len + 2 * spec.block_size
    target, draft = build_models(
        shape,
        spec,
        device,
        dtype,
        max_positions,
        load_weights(Path(target_dir)),
        load_weights(Path(draft_dir)),
    )
    graphs = device.type == "cuda" if use_cuda_graphs is None else use_cuda_graphs
    logger.info(
        "loaded target %s and draft %s on %s (%s, cuda graphs: %s, compiled: %s, verify: %s, "
        "attention: %s)",
        target_dir,
        draft_dir,
        device,
        dtype,
        graphs,
        compile_scope if compile_forwards else False,
        verify_mode,
        attention,
    )
    return ModelRunner(
        target,
        draft,
        device,
        dtype,
        max_batch_size,
        max_seq_len,
        graphs,
        compile_forwards,
        synthetic=synthetic,
        verify_mode=verify_mode,
        compile_scope=compile_scope,
        attention=attention,
        compile_mode=compile_mode,
        compile_attention_ahead=compile_attention_ahead,
        graph_warmups=graph_warmups,
        linear=linear,
        defer_context=defer_context,
        plain_burst_graph=plain_burst_graph,
    )
