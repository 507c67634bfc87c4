"""Regional compilation of the decoder-layer steps, with few compiles at start-up.

``compile_scope: layer`` compiles the target's and the draft's layer step once each for all
their layers (docs/engine.md). What a first start then costs is the number of times dynamo
compiles each step over the shapes the engine captures: every graph shape (batch × width for
the padded verify and the draft, batch × width × tokens for the ragged verify, prompt lengths
for prefill) reaches the same step. Left to dynamo's defaults, the two steps compiled 17
graphs over the H200 8B capture (the target's 14, the draft's 3; session 18,
``TORCH_LOGS=recompiles``, bench/results/ragged_gpu_check_h200_2026-12-03s18_ab_old.log): once
statically, again when the width and then the batch changed (automatic dynamic shapes), again
for batch 1 and width 1 (dynamo specialises sizes 0 and 1), and again for every input whose
strides differed between shapes (an expanded view's stride 0 at width > 1 but not at width 1,
a size-1 dimension's arbitrary stride); 2-4 s each on the H200. With the settings below: 8
graphs (the target's 6, the draft's 2; ``..._ab_new.log``).

So the steps are compiled with:

- the varying dimensions marked dynamic before the first compile (``mark_dynamic``: the
  batch, the width, the packed token count, the prompt length), so the first compile serves
  every size above 1;
- ``backed_size_oblivious`` (where this torch has it): fewer guards that tell a size of 1
  apart; dynamo still compiles batch 1 and width 1 on their own (their graphs stay static,
  as the batch-1 plain decode wants);
- no duck sizing: two dimensions that happen to be equal at the first compile (batch 64 and
  grouped width 4 × 16) keep separate symbols, so the next shape does not recompile;
- inputs with row-major strides (``dense``), so no stride guard tells shapes apart.

These settings are process-wide (dynamo's and the symbolic-shape configuration); an engine
with ``torch_compile`` owns its process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
import torch._dynamo
import torch.fx.experimental._config as shape_config

from engines.embedded.events import CompileMode, inductor_arguments

# Every forward shares one layer step, so its variants (padded, ragged, prefill; their batch 1
# forms where the settings above do not merge them) may exceed dynamo's default of 8 compiles
# per function, past which it would silently run eager.
RECOMPILE_LIMIT = 64


def compile_layer_step(step: Callable[..., torch.Tensor], mode: CompileMode) -> Any:
    """``torch.compile`` of one layer step (fullgraph: a graph break fails at start-up) with
    the settings above."""
    torch._dynamo.config.recompile_limit = max(
        torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT
    )
    if hasattr(shape_config, "backed_size_oblivious"):
        shape_config.backed_size_oblivious = True
    if hasattr(shape_config, "use_duck_shape"):
        shape_config.use_duck_shape = False
    return torch.compile(step, fullgraph=True, **inductor_arguments(mode))


class LayerSteps(Protocol):
    """A model whose forward runs ``layer_step`` per layer (TargetModel, DraftModel)."""

    layer_step: Callable[..., torch.Tensor]
    compiled_layers: bool


@contextlib.contextmanager
def plain_layer_steps(*models: LayerSteps) -> Iterator[None]:
    """Inside: the models' forwards run their plain layer steps, not the compiled ones.

    For the forwards that are not captured in CUDA graphs (batched prefills, eager steps):
    their shapes keep changing (rows x longest prompt, packed token counts), so the shared
    compiled step would compile again for each, seconds apiece on the GPU, and a packed
    prefill's attention does not compile at all (a data-dependent guard in SDPA's mask): on
    the H100 every batched prefill failed that way, was retried one request at a time, and
    the step kept compiling until dynamo's accumulated limit of 256 (session 35). A no-op for
    a model whose steps are not compiled."""
    swapped = [m for m in models if m.compiled_layers]
    compiled = [m.layer_step for m in swapped]
    try:
        for model in swapped:
            model.layer_step = type(model).layer_step  # the class's plain function
            model.compiled_layers = False
        yield
    finally:
        for model, step in zip(swapped, compiled, strict=True):
            model.layer_step = step
            model.compiled_layers = True


def mark_dynamic(tensor: torch.Tensor | None, *dims: int) -> None:
    """Compile ``tensor``'s ``dims`` as dynamic sizes from the first compile on. Only sizes
    above 1 are marked: a size-1 dimension stays static (the packed forwards' leading 1; batch
    1 and width 1, which dynamo compiles on their own anyway). A no-op outside compilation."""
    if tensor is None:
        return
    for dim in dims:
        if tensor.shape[dim] > 1:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)


def dense(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with row-major strides for its sizes, size-1 dimensions included (a copy
    only where they differ): an expanded view has stride 0 where the same view of another
    shape has not, and a compiled step guards its inputs' strides."""
    expected, stride = [], 1
    for size in reversed(tensor.shape):
        expected.append(stride)
        stride *= size
    if tuple(reversed(expected)) == tensor.stride():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)
