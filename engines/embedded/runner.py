"""Runs the models for one batch: prefill a request, or one speculative step for all running rows.

A step is: draft proposes a block for every row -> target verifies ``[last, drafts...]``
(padded to a captured width; with ``verify_mode="ragged"`` graphs the GEMMs run on the packed
tokens the rows use, engines/embedded/ragged.py) -> the verified positions' target features go
into the draft's context cache -> accept (greedy or rejection sampling; benchmark only: drawn
from a synthetic profile, engines/embedded/synthetic.py). One device->host copy at the end.
Rows with k = 0 verify only their last token but still get their draft context updated.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from engines.embedded.cuda_graphs import GraphedCall, StaticCall, padded_size, setup_seconds
from engines.embedded.decode_attention import compile_ahead, triton_interpreted
from engines.embedded.device_allocation import AllocationGraphs, DeviceScoring
from engines.embedded.draft import DraftModel
from engines.embedded.events import (
    ATTENTION_CHOICES,
    COMPILE_MODES,
    COMPILE_SCOPES,
    LINEAR_CHOICES,
    VERIFY_MODES,
    Attention,
    AttentionChoice,
    CompileMode,
    CompileScope,
    LinearChoice,
    LinearKernel,
    VerifyMode,
    inductor_arguments,
)
from engines.embedded.kv_cache import KVCache
from engines.embedded.layers import check_grouped_attention, decoder_layers
from engines.embedded.packing import Packing, unpack
from engines.embedded.ragged import RaggedShapes, full_rows, ragged_index
from engines.embedded.regional import plain_layer_steps
from engines.embedded.request import Request
from engines.embedded.sampling import sample_from_probs, sampling_probs
from engines.embedded.speculative import verify_greedy, verify_rejection
from engines.embedded.synthetic import SyntheticAcceptance, assemble_rows
from engines.embedded.target import TargetModel
from engines.embedded.top1 import reference as top1_reference
from engines.embedded.top1 import top1
from policies.slot_scoring import SlotScoring
from policies.types import PositionValues, max_spec_tokens

logger = logging.getLogger(__name__)

GRAPH_BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]
KEY_BUCKET = 64  # eager attention reads keys up to the batch's longest row, rounded up
PREFILL_BUCKET = 64  # captured prefill lengths: multiples of this, and max_seq_len
# defer_context: plain steps a row's stash holds before they are inserted in one forward.
DEFERRED_POSITIONS = 16
CONFIDENCE_SCALE = 1_000_000  # draft confidence crosses to the host as integers of this scale


# Two-phase steps: per row, the draft's confidence at its drafted positions -> k per row.
Allocate = Callable[[list[PositionValues]], list[int]]


@dataclass(frozen=True)
class _Draws:
    """A synthetic step's draws: runs int64 [B]; confidence float64 [B, K] or None."""

    runs: np.ndarray
    confidence: np.ndarray | None


@dataclass(frozen=True)
class StepResult:
    accepted: list[list[bool]]  # per row, length k of that row
    new_tokens: list[list[int]]  # per row: accepted drafts then the bonus token
    step_time_s: float
    # Per row, length k of that row (of what it drafted, when the device allocated the step):
    # the draft distribution's top-1 probability at each drafted position (temperature-scaled
    # when the row samples); in synthetic mode the drawn confidence
    # (SyntheticAcceptance.draft_confidence). None when the step did not measure it.
    draft_confidence: list[list[float]] | None = None
    # The k each row verified when the step allocated after drafting (else the planned k).
    spec_tokens: list[int] | None = None
    # The step's allocation ran on the device (``step(scoring=...)`` and a scoring was given).
    on_device: bool = False


def eager_attention(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Attention backends of the eager forwards (prefills, eager steps) on a GPU: every SDPA
    backend but cuDNN's. cuDNN builds (and JIT-compiles) a kernel per new shape, and eager
    shapes keep changing (a batched prefill's rows x longest prompt): the first use of each
    shape can stall a step for a large fraction of a second. CUDA-graph forwards keep the
    default (their shapes are fixed and built at capture). Elsewhere: no change."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    )


def choose_attention(
    choice: AttentionChoice, target: TargetModel, device: torch.device, dtype: torch.dtype
) -> Attention:
    """The target's attention kernel for ``choice``. ``triton`` is checked on the device first
    (``check_grouped_attention``: a kernel that fails to build or run, or gives other
    results, stops start-up rather than a served step); ``auto`` takes triton on a CUDA
    device when that check passes, and sdpa otherwise (a failed check is logged with its
    reason). Measured on the H200: docs/engine.md, "Attention"."""
    if choice == "sdpa" or (choice == "auto" and device.type != "cuda"):
        return "sdpa"
    shape = target.shape
    try:
        worst = check_grouped_attention(
            shape.num_heads, shape.num_kv_heads, shape.head_dim, device, dtype
        )
    except RuntimeError as exc:
        if choice == "triton":
            raise
        logger.warning("attention: auto uses sdpa: %s", exc)
        return "sdpa"
    logger.info("attention: %s uses triton (start-up check: largest diff %.3g)", choice, worst)
    return "triton"


def _check_triton_device(setting: str, kernel: str, instead: str, device: torch.device) -> None:
    """A Triton kernel setting runs on CUDA, or on the CPU under Triton's interpreter."""
    if device.type != "cuda" and not triton_interpreted():
        raise ValueError(
            f"{setting}={kernel!r} runs on CUDA, not {device.type} (tests run it on the CPU "
            f"with TRITON_INTERPRET=1); use {setting}={instead!r}"
        )


@dataclass
class PlainBurst:
    """Plain steps queued on the device whose tokens the host has not read yet
    (``ModelRunner.plain_queue``; read with ``plain_collect``). ``last``, ``start`` and
    ``pending``: each row's input token, position and stash column for the steps after it, on
    the device (a burst queued after this one starts from them); ``positions`` and ``stash``:
    the same positions and stash columns on the host, as they will be once it has run."""

    rows: list[Request]
    tokens: torch.Tensor  # [B, steps], on the device
    steps: int
    # the rows' sampling settings on the device (None: every row greedy), made once a chain
    params: tuple[torch.Tensor, ...] | None
    last: torch.Tensor
    start: torch.Tensor
    pending: torch.Tensor
    positions: list[int]
    stash: list[int]
    started: float  # the runner's clock when it was queued (or its predecessor was read)
    # ``tokens`` on the host once ``ready`` (on a GPU: copied to pinned memory right behind
    # the burst, before anything queued after it, so reading it waits for this burst alone)
    host: torch.Tensor
    ready: torch.cuda.Event | None


class ModelRunner:
    def __init__(
        self,
        target: TargetModel,
        draft: DraftModel,
        device: torch.device,
        dtype: torch.dtype,
        max_batch_size: int,
        max_seq_len: int,
        use_cuda_graphs: bool,
        compile_forwards: bool = False,
        synthetic: SyntheticAcceptance | None = None,
        verify_mode: VerifyMode = "padded",
        compile_scope: CompileScope = "forward",
        prune_ragged: bool | None = None,
        attention: AttentionChoice = "sdpa",
        compile_mode: CompileMode = "default",
        compile_attention_ahead: bool | None = None,
        graph_warmups: int = 1,
        linear: LinearChoice = "auto",
        defer_context: bool | None = None,
        plain_burst_graph: int = 0,
    ) -> None:
        """``use_cuda_graphs``: fixed-shape steps, captured as CUDA graphs on a CUDA device (on
        the CPU the same static buffers run eagerly: tests of the graph path). ``verify_mode``
        (graph runners): ``padded`` verifies every row at the widest k; ``ragged`` replays
        graphs whose GEMMs run on the packed tokens the rows use. ``compile_scope`` (with
        ``compile_forwards``): ``forward`` compiles each forward whole; ``layer`` compiles the
        target's and the draft's decoder-layer steps once each for all their layers (regional
        compilation: start-up no longer grows with the depth); the glue stays eager.
        ``prune_ragged`` (ragged graph runners; default: on a CUDA device): time every graph
        after capture and drop the ragged buckets slower than their padded graph
        (``keep_faster_ragged``). ``attention``: the target's attention kernel in steps,
        ``sdpa`` or ``triton`` (the split-KV kernel of decode_attention.py, reading only the
        keys each row uses; CUDA, or the CPU under ``TRITON_INTERPRET=1`` for tests), or
        ``auto``: triton on a CUDA device where the start-up check passes it, else sdpa
        (``self.attention`` is the kernel chosen).
        ``compile_mode`` (with ``compile_forwards``): inductor's ``default``, or
        ``max-autotune`` (kernel choices benchmarked per shape at start-up).
        ``compile_attention_ahead`` (graph runners with the Triton attention or the
        few-token linear kernel; default: on a CUDA device): before the captures, one
        forward per verify shape with those kernels compiled in worker processes instead of
        launched
        (``_compile_attention_ahead``). ``graph_warmups``: runs of each graph's function
        before its capture (at least 1; ``cuda_graphs.GraphedCall``). On the H200 8B shape
        one warm-up instead of two took ~7 s off a first start's ragged captures, and
        compiling ahead (with one warm-up) 6-12 s off each of three paired first starts
        (session 27, ``bench/results/first_start_h200_2026-12-04s27*.json``). ``linear``:
        the linear layers' kernel, ``aten`` (``F.linear``), ``gemv`` (``gemv.small_linear``
        for steps of up to 16 tokens: the target's and the draft's layers, the LM head, the
        draft's context projection; CUDA, or the CPU under ``TRITON_INTERPRET=1``), ``fused``
        (gemv, with the layers' RMSNorms, SiLU gate and residual adds inside it in steps of at
        most ``gemv.FUSED_MAX_ROWS`` tokens), or ``auto`` (the default): fused on a CUDA
        device, else aten (``self.linear`` is the kernel chosen). On the H200 8B shape the
        batch-1 plain step took 5.05 / 4.88 / 4.70 ms with aten / gemv / fused (session 28b).
        ``defer_context`` (default: on a CUDA device): a step where every row verifies k = 0
        keeps the target's features of its token in a stash instead of inserting them into
        the draft's context (the draft's projections then run once per
        ``DEFERRED_POSITIONS`` plain steps, for all of them, or not at all if the row never
        drafts again); a row's stash is inserted before it drafts (``_insert_deferred``), so
        its drafts see the same context. On the H200 8B shape it took 0.19-0.22 ms off the
        plain step at batch 1, 8 and 64 (session 28a). ``plain_burst_graph`` (graph runners
        with ``defer_context``; 0 or 1: none): a burst of exactly this many greedy plain steps
        (``plain_steps``) replays one graph that holds all of them, each step's argmax fed
        to the next inside it, instead of one graph, an argmax and the inputs' copies per step
        (the device's gaps between a burst's steps; ``burst_graphs`` turns its use off)."""
        if linear not in LINEAR_CHOICES:
            raise ValueError(f"linear={linear!r}: use one of {', '.join(LINEAR_CHOICES)}")
        if linear == "auto":
            linear = "fused" if device.type == "cuda" else "aten"
        if defer_context is None:
            defer_context = device.type == "cuda"
        if linear != "aten":
            _check_triton_device("linear", linear, "aten", device)
        self.linear: LinearKernel = linear
        for model in (target, draft):
            model.gemv = linear != "aten"
            model.fuse_small_steps = linear == "fused"
            for layer in decoder_layers(model.layers):
                layer.gemv = linear != "aten"
        if graph_warmups < 1:
            raise ValueError(f"graph_warmups={graph_warmups}: at least 1 (a capture needs one)")
        self.graph_warmups = graph_warmups
        if compile_mode not in COMPILE_MODES:
            raise ValueError(
                f"compile_mode={compile_mode!r}: use one of {', '.join(COMPILE_MODES)}"
            )
        if attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention={attention!r}: use one of {', '.join(ATTENTION_CHOICES)}")
        if attention == "triton":
            _check_triton_device("attention", "triton", "sdpa", device)
        if compile_scope not in COMPILE_SCOPES:
            raise ValueError(
                f"compile_scope={compile_scope!r}: use one of {', '.join(COMPILE_SCOPES)}"
            )
        if verify_mode not in VERIFY_MODES:
            raise ValueError(f"verify_mode={verify_mode!r}: use one of {', '.join(VERIFY_MODES)}")
        self.target, self.draft, self.device, self.dtype = target, draft, device, dtype
        target.attention = self.attention = choose_attention(attention, target, device, dtype)
        # torch.compile fuses the small per-layer ops (norms, RoPE, cache writes, residuals)
        # into a few kernels; the graphs below then capture the compiled forwards. Costs a
        # compile per distinct shape class at start-up (see docs/engine.md).
        if compile_forwards and not use_cuda_graphs:
            raise ValueError(
                "torch_compile needs CUDA graphs (device cuda): the compiled forwards are "
                "captured once per graph shape; without graphs shapes change every step and "
                "each change recompiles"
            )
        self.compile_forwards = compile_forwards
        # Eager steps compute only the tokens each row uses (engines/embedded/packing.py);
        # CUDA graphs replay fixed padded shapes.
        self.pack_ragged = not use_cuda_graphs
        # Report the draft's confidence with every step (two-phase steps measure it anyway):
        # two reductions over [B, k, vocab] logits per step, so only when someone reads it.
        self.measure_confidence = False
        # Steps with every row at k = 0 skip the draft path's set-up (``_plain_step``); off,
        # they take the general path (benchmarks and tests compare the two).
        self.plain_fast_path = True
        # Device-allocated two-phase steps may run in drafting bursts (``spec_steps``'s
        # ``scoring``: one scoring and budget per burst); off, each runs alone (``step``).
        self.allocates_in_bursts = True
        self.defer_context = defer_context
        if plain_burst_graph < 0 or plain_burst_graph > DEFERRED_POSITIONS:
            raise ValueError(
                f"plain_burst_graph={plain_burst_graph}: 0 (none) to {DEFERRED_POSITIONS} steps"
            )
        # Steps of the plain-burst graphs (captured with ``defer_context``; 0: none), and
        # whether ``plain_steps`` replays them (benchmarks compare both on one runner).
        self.plain_burst_graph = plain_burst_graph if defer_context else 0
        self.burst_graphs = True
        self._stash: torch.Tensor | None = None  # [max batch, DEFERRED_POSITIONS, features]
        if defer_context:
            features = draft.fc.weight.shape[1]
            self._stash = torch.zeros(
                max_batch_size, DEFERRED_POSITIONS, features, device=device, dtype=dtype
            )
        self._stashing_verify: Callable[..., torch.Tensor] = self._stashing_verify_forward
        self._verify: Callable[..., torch.Tensor] = self._verify_forward
        self._draft: Callable[..., torch.Tensor] = self._draft_forward
        self._ragged_verify: Callable[..., torch.Tensor] = self._ragged_verify_forward
        if compile_forwards and compile_scope == "layer":
            target.compile_layers(compile_mode)
            draft.compile_layers(compile_mode)
        elif compile_forwards:
            how = inductor_arguments(compile_mode)
            self._verify = torch.compile(self._verify_forward, fullgraph=True, **how)
            if defer_context:
                self._stashing_verify = torch.compile(
                    self._stashing_verify_forward, fullgraph=True, **how
                )
            self._draft = torch.compile(self._draft_forward, fullgraph=True, **how)
            self._ragged_verify = torch.compile(self._ragged_verify_forward, fullgraph=True, **how)
        self.compile_mode = compile_mode
        self.compile_scope = compile_scope
        self.block_size = draft.spec.block_size
        self.mask_token_id = draft.spec.mask_token_id
        # Benchmark only (engines/embedded/synthetic.py): accept decisions drawn, not verified.
        self.synthetic = synthetic
        if synthetic is not None:
            if synthetic.num_positions < max_spec_tokens(self.block_size):
                raise ValueError(
                    f"synthetic profile set {synthetic.name!r} covers k <= "
                    f"{synthetic.num_positions}; this draft drafts up to "
                    f"{max_spec_tokens(self.block_size)}"
                )
            logger.warning("%s", synthetic.warning)
        self.use_cuda_graphs = use_cuda_graphs
        self.batch_sizes = [b for b in GRAPH_BATCH_SIZES if b < max_batch_size]
        self.batch_sizes.append(max_batch_size)
        # Verify widths 1 (plain decode) and multiples of 8: widths like 5 or 9 cost more on GPU.
        self.widths = [1, *range(8, self.block_size + 8, 8)]
        # Draft graphs per verify width w > 1: logits for the first w - 1 drafted positions
        # only (the block still runs whole through the draft's layers). A step that verifies
        # at most 7 drafts skips the LM head on the other 8 positions of a 16-token block: at
        # 64 rows that is 512 of 960 vocab-sized output rows. Off: every draft computes the
        # whole block's logits (step_profile prices steps so: two-phase steps draft whole).
        self.draft_widths = sorted({min(w, self.block_size) for w in self.widths if w > 1})
        self.narrow_drafts = True
        # The draft's argmax and confidence in one read of its logits (engines/embedded/
        # top1.py; on by default on CUDA, where it replaces five or more reductions); off:
        # PyTorch's reductions (on a CPU they are the faster; tests switch it on there to run
        # the kernels under Triton's interpreter).
        self.fused_top1 = device.type == "cuda"
        # Room for a full block past the last position; a multiple of 64 keeps the attention
        # mask rows aligned for the memory-efficient SDPA kernel.
        cache_len = -(-(max_seq_len + max(self.block_size, self.widths[-1])) // 64) * 64
        ts, ds = target.shape, draft.spec.shape
        self.target_cache = KVCache(
            ts.num_layers, max_batch_size, ts.num_kv_heads, cache_len, ts.head_dim, dtype, device
        )
        self.draft_cache = KVCache(
            ds.num_layers, max_batch_size, ds.num_kv_heads, cache_len, ds.head_dim, dtype, device
        )
        self.verify_mode = verify_mode
        self.ragged_shapes = RaggedShapes(self.batch_sizes, self.widths)
        # Ragged verify graphs unpack their logits into this one buffer (each graph's own
        # output would hold B * W * vocab logits per captured token bucket).
        self._ragged_logits = torch.empty(0, device=device, dtype=dtype)
        # Ragged verifies' queries, scattered into attention's grouped layout (finite: zeros,
        # then earlier queries; Packing.grouped_queries).
        self._ragged_queries: torch.Tensor | None = None
        self._graphs: dict[tuple[str, int, int], StaticCall] = {}
        # The last step's two-phase wait on the host clock: (blocked on the draft's confidence,
        # from it to the verify's launch: the allocation, index build, launch); 0 one-phase.
        # A step allocated on the device: (0, queueing the allocation's kernels and the verify).
        self.last_two_phase_s = (0.0, 0.0)
        # Single-request prefills replay a graph of the prompt padded to a multiple of
        # PREFILL_BUCKET (an eager prefill is bound by kernel launches on a GPU).
        self.prefill_lengths = [*range(PREFILL_BUCKET, max_seq_len, PREFILL_BUCKET), max_seq_len]
        self._prefill_graphs: dict[int, StaticCall] = {}
        self._ragged_graphs: dict[tuple[int, int, int], StaticCall] = {}
        # Device-allocated steps: their allocation and index, one graph per shape (lazily),
        # and synthetic mode's drawn confidence on its way there (``_staged``).
        self._allocation_graphs = AllocationGraphs(device)
        self._confidence_staging: torch.Tensor | None = None
        # Synthetic mode: the next device-allocated step's draws, made while this one verifies
        # (its rows' (task, key, step) and whether they include confidence), and how many
        # steps found theirs made ahead.
        self._draws_ahead: tuple[tuple[tuple[str, str, int], ...], bool, _Draws] | None = None
        self.draws_ahead_used = 0
        # Per captured verify graph, its measured step (``keep_faster_ragged``), and the
        # ragged buckets that were slower than their padded graph (dropped).
        self.graph_ms: dict[str, dict[str, float]] = {"padded": {}, "ragged": {}}
        self.ragged_dropped: list[tuple[int, int, int]] = []
        # Start-up seconds spent capturing the padded graphs (verify and draft, then prefill)
        # and the ragged verify graphs (capture, then pruning); ``capture_parts_s`` splits
        # them, and ``first_*`` is the first graph of a kind: a compiled runner compiles there.
        self.capture_s = {"padded": 0.0, "ragged": 0.0}
        self.capture_parts_s: dict[str, float] = {}
        # Per kind of graph (padded, prefill, ragged), its graphs' set-up seconds summed by
        # stage (``cuda_graphs.setup_seconds``: warm-ups queued, waited for, the capture's
        # forward, the capture's end); empty without CUDA graphs.
        self.capture_stages_s: dict[str, dict[str, float]] = {}
        # Triton kernel specialisations (the attention's, the few-token linear's) compiled
        # ahead of the captures (0: none).
        self.attention_compiled_ahead = 0
        if use_cuda_graphs:
            started = time.perf_counter()
            self._empty_cache()  # once here, not per capture (``keep_allocator_cache``)
            ahead = compile_attention_ahead
            if ahead is None:
                ahead = device.type == "cuda"
            if ahead and (self.attention == "triton" or self.linear != "aten"):
                self._compile_attention_ahead()
                self.capture_parts_s["attention_ahead"] = time.perf_counter() - started
            self._capture()
            marked = time.perf_counter()
            self.capture_parts_s["verify_and_draft"] = marked - started
            self._capture_prefill()
            self.capture_parts_s["prefill"] = time.perf_counter() - marked
            self.capture_s["padded"] = time.perf_counter() - started
            self.capture_stages_s["padded"] = setup_seconds(self._graphs.values())
            self.capture_stages_s["prefill"] = setup_seconds(self._prefill_graphs.values())
            if verify_mode == "ragged":
                marked = time.perf_counter()
                self._capture_ragged()
                self.capture_parts_s["ragged_graphs"] = time.perf_counter() - marked
                self.capture_stages_s["ragged"] = setup_seconds(self._ragged_graphs.values())
                if device.type == "cuda" if prune_ragged is None else prune_ragged:
                    marked = time.perf_counter()
                    self.keep_faster_ragged()
                    self.capture_parts_s["ragged_pruning"] = time.perf_counter() - marked
                self.capture_s["ragged"] = time.perf_counter() - started - self.capture_s["padded"]
            self._empty_cache()  # the warm-ups' memory, kept cached across the captures

    # -- forwards (graphable: fixed shapes, whole cache as keys) --------------------------------

    def _verify_forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        num_keys: int | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        hidden, features = self.target(
            ids, positions, self.target_cache, num_keys=num_keys, packing=packing
        )
        self.draft.insert_context(features, positions, self.draft_cache, packing=packing)
        return unpack(self.target.logits(hidden), packing)

    def _stashing_verify_forward(
        self, ids: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor
    ) -> torch.Tensor:
        """A k = 0 verify that stashes the draft's context instead of inserting it: ids,
        positions [B, 1]; row b's features go to stash column ``columns[b]``."""
        hidden, features = self.target(ids, positions, self.target_cache)
        assert self._stash is not None, "defer_context off"
        rows = torch.arange(ids.shape[0], device=ids.device)
        self._stash[rows, columns] = features[:, 0]
        return self.target.logits(hidden)

    def _stashing_burst(
        self, ids: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor, *, steps: int
    ) -> torch.Tensor:
        """``steps`` greedy plain steps of ``_stashing_verify`` back to back, each row's
        input the previous step's argmax, its position and stash column one further a step
        (the plain-burst graph's function): ids, positions [B, 1], columns [B]. Returns the
        tokens [B, steps]."""
        out = []
        for i in range(steps):
            if i:
                positions, columns = positions + 1, columns + 1
            ids = self._stashing_verify(ids, positions, columns)[:, 0].argmax(dim=-1)[:, None]
            out.append(ids)
        return torch.cat(out, dim=1)

    def _insert_stash_forward(self, positions: torch.Tensor) -> torch.Tensor:
        """Every row's stash into the draft's context at ``positions`` [B, DEFERRED_POSITIONS]
        (a column not pending writes at a scratch position). Returns ``positions``."""
        assert self._stash is not None, "defer_context off"
        self.draft.insert_context(self._stash[: positions.shape[0]], positions, self.draft_cache)
        return positions

    def _draft_forward(
        self,
        block_ids: torch.Tensor,
        positions: torch.Tensor,
        num_keys: int | None = None,
        rows: Packing | None = None,
        outputs: Packing | None = None,
        *,
        num_outputs: int | None = None,
    ) -> torch.Tensor:
        return self.draft.propose(
            block_ids,
            positions,
            self.draft_cache,
            self.target,
            num_keys=num_keys,
            rows=rows,
            outputs=outputs,
            num_outputs=None if num_outputs == self.block_size - 1 else num_outputs,
        )

    def _ragged_verify_forward(
        self, ids: torch.Tensor, positions: torch.Tensor, index: torch.Tensor
    ) -> torch.Tensor:
        """The verify forward of a ragged graph: ids, positions [B, W]; index [2, N] (gather,
        scatter; engines/embedded/ragged.py). Returns logits [B, W, vocab] in the shared
        buffer, valid at the tokens the index packs (the rest is stale)."""
        batch, width = ids.shape
        packing = Packing.from_indices((batch, width), index[0], index[1])
        packing.query_buffer = self._ragged_queries
        hidden, features = self.target(ids, positions, self.target_cache, packing=packing)
        self.draft.insert_context(features, positions, self.draft_cache, packing=packing)
        return packing.unpack(self.target.logits(hidden), out=self._ragged_logits)

    def _empty_cache(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _static_call(self) -> tuple[Callable[..., StaticCall], object]:
        """CUDA graphs sharing one pool on a CUDA device; eager static calls elsewhere."""
        if self.device.type == "cuda":
            graphed = functools.partial(GraphedCall, warmups=self.graph_warmups)
            return graphed, torch.cuda.graph_pool_handle()
        return StaticCall, None

    @property
    def lazy_set_ups(self) -> int:
        """What the runner has set up on first use so far, counted (each device allocation's
        shape, captured as a CUDA graph on a GPU): a step during which it grew paid that
        one-off cost (``StepReport.first_use``)."""
        return len(self._allocation_graphs)

    def _capture(self) -> None:
        call, pool = self._static_call()
        for batch in reversed(self.batch_sizes):  # largest first so smaller ones reuse the pool
            for width in reversed(self.widths):
                ids = torch.zeros(batch, width, dtype=torch.long, device=self.device)
                pos = torch.arange(width, device=self.device).repeat(batch, 1)
                with self._first("first_verify"):
                    self._graphs["verify", batch, width] = call(self._verify, (ids, pos), pool)
            if self.defer_context:
                ids = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
                pos = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
                columns = torch.zeros(batch, dtype=torch.long, device=self.device)
                self._graphs["stash", batch, 1] = call(
                    self._stashing_verify, (ids, pos, columns), pool
                )
                if self.plain_burst_graph > 1:
                    steps = self.plain_burst_graph
                    burst = functools.partial(self._stashing_burst, steps=steps)
                    self._graphs["stash_burst", batch, steps] = call(
                        burst, (ids, pos, columns), pool
                    )
                pos = torch.arange(DEFERRED_POSITIONS, device=self.device).repeat(batch, 1)
                self._graphs["insert_stash", batch, DEFERRED_POSITIONS] = call(
                    self._insert_stash_forward, (pos,), pool
                )
            ids = torch.zeros(batch, self.block_size, dtype=torch.long, device=self.device)
            pos = torch.arange(self.block_size, device=self.device).repeat(batch, 1)
            for width in reversed(self.draft_widths):
                draft = functools.partial(self._draft, num_outputs=width - 1)
                with self._first("first_draft"):
                    self._graphs["draft", batch, width] = call(draft, (ids, pos), pool)

    def _compile_attention_ahead(self) -> None:
        """One forward of every padded verify graph's shape and of one token bucket per ragged
        (B, W) (the attention's arguments do not depend on the bucket), with the Triton
        attention's and the few-token linear kernel's launches (``linear`` gemv / fused)
        collected instead of made: each kernel specialisation they need compiles in a worker
        process (decode_attention.compile_ahead) while this thread goes on (and compiles the
        forwards, which the captures' warm-ups would do anyway); then it waits. The captures
        find those kernels compiled (the draft's, of the same matrix sizes, too). Outputs,
        and the cache positions these forwards write, are scratch (the captures write them
        too)."""
        with compile_ahead() as ahead:
            for batch in reversed(self.batch_sizes):
                for width in reversed(self.widths):
                    ids = torch.zeros(batch, width, dtype=torch.long, device=self.device)
                    pos = torch.arange(width, device=self.device).repeat(batch, 1)
                    self._verify(ids, pos)
            if self.verify_mode == "ragged" and self.ragged_shapes.keys:
                self._ragged_buffers()
                for (batch, width), sizes in self.ragged_shapes.buckets.items():
                    ids = torch.zeros(batch, width, dtype=torch.long, device=self.device)
                    pos = torch.arange(width, device=self.device).repeat(batch, 1)
                    lengths = full_rows(sizes[0], width)
                    index = ragged_index(lengths, batch, width, sizes[0]).to(self.device)
                    self._ragged_verify(ids, pos, index)
        self.attention_compiled_ahead = ahead.submitted
        self.capture_parts_s["attention_ahead_wait"] = ahead.waited_s

    @contextlib.contextmanager
    def _first(self, name: str) -> Iterator[None]:
        """Times the block into ``capture_parts_s[name]`` the first time only."""
        if name in self.capture_parts_s:
            yield
            return
        started = time.perf_counter()
        yield
        self.capture_parts_s[name] = time.perf_counter() - started

    def _prefill_graph_forward(
        self, ids: torch.Tensor, positions: torch.Tensor, slot: torch.Tensor, last: torch.Tensor
    ) -> torch.Tensor:
        """One prompt padded to a captured length: ids, positions [1, L]; slot, last [1] (the
        request's slot, its last prompt position). Logits [1, 1, vocab] at ``last``. The
        padding writes K/V past the prompt, which the request's first steps overwrite before
        reading (every step writes its positions before attending to them)."""
        hidden, features = self.target(ids, positions, self.target_cache, slots=slot)
        self.draft.insert_context(features, positions, self.draft_cache, slots=slot)
        return self.target.logits(hidden.index_select(1, last))

    def _capture_prefill(self) -> None:
        call, pool = self._static_call()
        slot = torch.zeros(1, dtype=torch.long, device=self.device)
        for length in reversed(self.prefill_lengths):
            ids = torch.zeros(1, length, dtype=torch.long, device=self.device)
            positions = torch.arange(length, device=self.device)[None]
            last = torch.full((1,), length - 1, dtype=torch.long, device=self.device)
            with self._first("first_prefill"):
                self._prefill_graphs[length] = call(
                    self._prefill_graph_forward, (ids, positions, slot, last), pool
                )

    def _capture_ragged(self) -> None:
        """One graph per (B, W, N) of ``ragged_shapes`` (largest first), one shared pool."""
        if not self.ragged_shapes.keys:
            return  # batch 1 only: no token bucket below a padded width
        call, pool = self._static_call()
        self._ragged_buffers()
        for batch, width, num_tokens in self.ragged_shapes.keys:
            ids = torch.zeros(batch, width, dtype=torch.long, device=self.device)
            pos = torch.arange(width, device=self.device).repeat(batch, 1)
            lengths = full_rows(num_tokens, width)  # any rows that sum to N
            index = ragged_index(lengths, batch, width, num_tokens).to(self.device)
            with self._first("first_ragged"):
                self._ragged_graphs[batch, width, num_tokens] = call(
                    self._ragged_verify, (ids, pos, index), pool
                )

    def _ragged_buffers(self) -> None:
        """The ragged graphs' shared logits and query buffers (once)."""
        if self._ragged_queries is not None:
            return
        rows = self.batch_sizes[-1] * self.widths[-1] + 1  # + the scratch row
        vocab = self.target.shape.vocab_size
        self._ragged_logits = torch.zeros(rows, vocab, device=self.device, dtype=self.dtype)
        shape = self.target.shape
        self._ragged_queries = torch.zeros(
            rows * shape.num_heads * shape.head_dim, device=self.device, dtype=self.dtype
        )

    def kernel_settings(self) -> dict[str, object]:
        """What, besides the models and the device, decides this runner's step times (the
        start-up cost profile's cache key, engines/embedded/step_profile.py)."""
        return {
            "attention": self.attention,
            "linear": self.linear,
            "defer_context": self.defer_context,
            "verify_mode": self.verify_mode,
            "cuda_graphs": self.use_cuda_graphs,
            "compiled": (
                f"{self.compile_scope}/{self.compile_mode}" if self.compile_forwards else False
            ),
            "dtype": str(self.dtype),
            # (only when captured: the keys of tables profiled without it stay valid)
            **(
                {"plain_burst_graph": self.plain_burst_graph}
                if self.use_cuda_graphs and self.plain_burst_graph > 1
                else {}
            ),
        }

    @property
    def per_row_widths(self) -> bool:
        """Whether a step's rows verify at their own widths (ragged CUDA-graph verifies, or the
        eager packed path), so per-row k change what a step costs."""
        return self.pack_ragged or self.verify_mode == "ragged"

    @torch.inference_mode()
    def keep_faster_ragged(
        self, repeats: int = 3, search: bool = True
    ) -> list[tuple[int, int, int]]:
        """Time the ragged verify graphs and the padded verify graph of their (B, W) (best of
        ``repeats`` replays on the inputs they were captured with, device synchronised), then
        drop the ragged buckets that are not faster than their padded graph; their steps
        replay the padded graph. ``search`` (the engine's start-up): per (B, W) a binary search
        for the first bucket not faster (``RaggedShapes.keep_faster_search``: ~log2 of the
        buckets timed); else every graph is timed (``RaggedShapes.keep_faster``; diagnostics).
        Runs at start-up on a CUDA device (~4 replays per graph timed); returns the dropped
        keys."""
        padded_s = {
            (batch, width): self._replay_s(self._graphs["verify", batch, width], repeats)
            for batch, width in self.ragged_shapes.buckets
        }
        if search:
            dropped, ragged_s = self.ragged_shapes.keep_faster_search(
                lambda key: self._replay_s(self._ragged_graphs[key], repeats), padded_s
            )
        else:
            ragged_s = {
                key: self._replay_s(graph, repeats) for key, graph in self._ragged_graphs.items()
            }
            dropped = self.ragged_shapes.keep_faster(ragged_s, padded_s)
        for key in dropped:
            del self._ragged_graphs[key]
        self.ragged_dropped += dropped
        self.graph_ms = {
            "padded": {f"{b}x{w}": 1e3 * t for (b, w), t in padded_s.items()},
            "ragged": {f"{b}x{w}x{n}": 1e3 * t for (b, w, n), t in ragged_s.items()},
        }
        logger.info(
            "ragged verify graphs: %d kept, %d slower than the padded graph dropped (%d timed)",
            len(self._ragged_graphs),
            len(dropped),
            len(ragged_s),
        )
        return dropped

    def _replay_s(self, call: StaticCall, repeats: int) -> float:
        """Best of ``repeats`` timed runs of ``call`` on its current inputs (after one untimed)."""
        cuda = self.device.type == "cuda"
        call.again()
        best = float("inf")
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize(self.device)
            started = time.perf_counter()
            call.again()
            if cuda:
                torch.cuda.synchronize(self.device)
            best = min(best, time.perf_counter() - started)
        return best

    def _run(
        self,
        name: str,
        ids: torch.Tensor,
        positions: torch.Tensor,
        *packings: Packing | None,
        eager: bool = False,
    ) -> torch.Tensor:
        """One forward: a CUDA-graph replay at padded shapes, or (eager) the packed forward
        that computes only the tokens the rows use (``packings``: see the forwards).

        ``eager`` skips the graphs of a graph runner: the forward then writes only these rows'
        cache slots (a replay padded to a captured batch size also writes the next slots)."""
        rows, width = ids.shape
        if self.use_cuda_graphs and not eager:
            graph = self._graphs[name, padded_size(rows, self.batch_sizes), width]
            return graph(ids, positions)[:rows]
        # The plain forwards: compiled ones exist only on graph runners, and new shapes would
        # recompile them.
        forward = self._verify_forward if name == "verify" else self._draft_forward
        num_keys = -(-(int(positions.max()) + 1) // KEY_BUCKET) * KEY_BUCKET
        with self._eager_forward():
            return forward(ids, positions, min(num_keys, self.target_cache.max_len), *packings)

    def _run_draft(
        self, block: torch.Tensor, positions: torch.Tensor, spec_tokens: list[int], eager: bool
    ) -> torch.Tensor:
        """The draft forward: logits [B, >= max(spec_tokens), vocab]. A graph replay computes
        the logits of the narrowest captured draft width that covers the step's widest k
        (``narrow_drafts``), else of the whole block; the eager forward only the k each row
        uses (``_draft_packings``)."""
        if self.use_cuda_graphs and not eager:
            rows = block.shape[0]
            width = self.block_size
            if self.narrow_drafts:
                width = padded_size(max(spec_tokens) + 1, self.draft_widths)
            graph = self._graphs["draft", padded_size(rows, self.batch_sizes), width]
            return graph(block, positions)[:rows]
        return self._run("draft", block, positions, *self._draft_packings(spec_tokens), eager=True)

    def _run_verify(
        self, ids: torch.Tensor, positions: torch.Tensor, spec_tokens: list[int], eager: bool
    ) -> torch.Tensor:
        """The verify forward: a ragged graph replay when this runner has one for the step's
        token count, else ``_run`` (padded replay, or the eager packed forward)."""
        rows, width = ids.shape
        # verify_mode may be switched to "padded" after capture (benchmarks compare the two).
        if self.verify_mode == "ragged" and self._ragged_graphs and not eager:
            batch = padded_size(rows, self.batch_sizes)
            lengths = [k + 1 for k in spec_tokens]
            num_tokens = self.ragged_shapes.choose(lengths, batch, width)
            if num_tokens is not None:
                # Built on the host from k; one small host->device copy through pinned memory,
                # so the host does not wait for the draft queued before it (a pageable copy
                # synchronises the stream first, and the device would then idle while the
                # verify is launched; in a burst, every step would wait for the one before).
                index = self._to_device(ragged_index(lengths, batch, width, num_tokens))
                graph = self._ragged_graphs[batch, width, num_tokens]
                return graph(ids, positions, index)[:rows]
        return self._run("verify", ids, positions, self._verify_packing(spec_tokens), eager=eager)

    # -- prefill -----------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, request: Request, uniforms: torch.Tensor) -> int:
        """Fill the request's slot with its prompt; return the first generated token."""
        return self._prefill_rows([request], uniforms[None])[0]

    @torch.inference_mode()
    def prefill_many(self, requests: list[Request], uniforms: torch.Tensor) -> list[int]:
        """Fill the slots of requests in consecutive slots with their prompts in one forward
        (packed: each prompt computes only its own tokens, attention per row); uniforms
        [B, >= 1] (CPU). Returns each request's first generated token.

        One forward instead of one per request: an eager prefill is bound by kernel launches
        on a GPU (tens of ms for a short prompt at the 8B shape), so a burst of admissions
        costs about one prefill (``plan_prefills`` keeps each forward's padded size bounded)."""
        return self._prefill_rows(requests, uniforms)

    def _prefill_rows(self, requests: list[Request], uniforms: torch.Tensor) -> list[int]:
        for request in requests:  # a prefill inserts its whole context
            request.pending_context = 0
        if len(requests) == 1 and self._prefill_graphs:
            return [self._prefill_replay(requests[0], uniforms)]
        first = requests[0].slot
        if [r.slot for r in requests] != list(range(first, first + len(requests))):
            raise ValueError(
                f"prefill_many needs consecutive slots, got {[r.slot for r in requests]}"
            )
        lengths = [len(r.prompt_ids) for r in requests]
        width = max(lengths)
        ids = torch.zeros(len(requests), width, dtype=torch.long)
        for row, request in enumerate(requests):
            ids[row, : lengths[row]] = torch.tensor(request.prompt_ids)
        ids = ids.to(self.device)
        positions = torch.arange(width, device=self.device).repeat(len(requests), 1)
        packing = None
        if min(lengths) < width:
            packing = Packing.from_lengths(torch.tensor(lengths, device=self.device), width)
        with self._eager_forward():
            hidden, features = self.target(
                ids, positions, self.target_cache, first, width, packing=packing
            )
        self.draft.insert_context(features, positions, self.draft_cache, first, packing=packing)
        if packing is None:
            last = hidden[:, -1]  # [B, hidden]
        else:
            ends = torch.tensor(lengths, device=self.device).cumsum(0) - 1
            last = hidden[0, ends]
        logits = self.target.logits(last)[:, None]  # [B, 1, vocab]
        probs = sampling_probs(logits, *self._params_tensors(requests))
        tokens = sample_from_probs(probs[:, 0], uniforms[:, 0].to(self.device))
        return [int(t) for t in tokens.tolist()]

    def _prefill_replay(self, request: Request, uniforms: torch.Tensor) -> int:
        """A single prompt through the captured prefill graph of its padded length."""
        length = len(request.prompt_ids)
        padded = padded_size(length, self.prefill_lengths)
        ids = torch.zeros(1, padded, dtype=torch.long)
        ids[0, :length] = torch.tensor(request.prompt_ids)
        inputs = torch.tensor([request.slot, length - 1])
        dev = self.device
        positions = torch.arange(padded, device=dev)[None]
        slot, last = inputs.to(dev).split(1)
        logits = self._prefill_graphs[padded](ids.to(dev), positions, slot, last)
        probs = sampling_probs(logits, *self._params_tensors([request]))
        return int(sample_from_probs(probs[:, 0], uniforms[:1, 0].to(dev))[0])

    def release_slot(self, moved: tuple[int, int] | None, length: int) -> None:
        if moved is not None:
            self.target_cache.move(*moved, length)
            self.draft_cache.move(*moved, length)
            if self._stash is not None:  # the moved request's stash goes with it
                self._stash[moved[1]] = self._stash[moved[0]]

    # -- one speculative step ----------------------------------------------------------------

    def _params_tensors(self, rows: list[Request]) -> tuple[torch.Tensor, ...]:
        params = [r.params for r in rows]
        dev = self.device
        return (
            torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev),
            torch.tensor([p.top_k for p in params], dtype=torch.long, device=dev),
        )

    @torch.inference_mode()
    def step(
        self,
        rows: list[Request],
        spec_tokens: list[int],
        uniforms: torch.Tensor,
        eager: bool = False,
        overlap: Callable[[], None] | None = None,
        allocate: Allocate | None = None,
        before_allocate: Callable[[], None] | None = None,
        scoring: Callable[[], SlotScoring | None] | None = None,
    ) -> StepResult:
        """rows occupy slots 0..len(rows)-1; uniforms [B, 2 * block_size + 1] (CPU).

        ``allocate``: a two-phase step. ``spec_tokens`` are then what each row drafts; once the
        draft has run, the rows' draft confidence (per row, its drafted positions) comes to
        the host (one extra sync) and ``allocate`` returns the k each row verifies, at most
        what it drafted (checked). Rows given 0 still get their draft context updated.
        ``before_allocate``: host work of the allocation that needs no confidence, run once
        the draft is queued and before that sync, so on a GPU it takes no step time.

        ``scoring``: a two-phase step allocated on the device instead (no sync between draft
        and verify; engines/embedded/device_allocation.py): ``spec_tokens`` are what each row
        drafts; once the draft is queued, ``scoring()`` (host work, hidden behind the draft)
        gives the ``SlotScoring``, whose tables go up without a sync (pinned copies); the
        step's tokens are rounded up from its ``budget`` to a captured bucket and the device
        fills the draft slots it pays for from the draft's confidence. ``scoring()`` None:
        every row verifies what it drafted. The result's ``spec_tokens`` say what each row
        verified and its ``draft_confidence`` covers every drafted position. Exclusive with
        ``allocate``.

        Writes each row's caches only at positions >= its ``position`` (scratch until the
        row advances), so a step whose result is dropped can be run again. ``eager``: see
        ``_run`` (the engine's culprit search runs prefixes of a batch that way).
        ``overlap``: host work run once every kernel of the step is queued, before the one
        sync, so on a GPU it takes no step time (the engine plans the next step there)."""
        started = self._clock()
        self.last_two_phase_s = (0.0, 0.0)
        widest = max(spec_tokens)
        if scoring is not None and allocate is not None:
            raise ValueError("a step allocates on the host (allocate) or the device (scoring)")
        on_device = scoring is not None and widest > 0
        measured = self.measure_confidence or allocate is not None or on_device
        confidence = torch.zeros(len(rows), 0, device=self.device)
        width = widest + 1 if not self.use_cuda_graphs else padded_size(widest + 1, self.widths)
        is_greedy = all(r.params.temperature <= 0 for r in rows)
        # One host->device copy of the step's small inputs (cannot be avoided: they are new).
        host = torch.tensor(
            [
                [r.last_token, r.position, k, r.pending_context]
                for r, k in zip(rows, spec_tokens, strict=True)
            ]
        )
        last, start, num_draft, pending = host.to(self.device).unbind(1)
        if widest == 0 and self.plain_fast_path:  # (synthetic too: nothing drawn at k = 0)
            plain = self._plain_step(
                rows,
                spec_tokens,
                last,
                start,
                pending,
                uniforms,
                is_greedy,
                eager,
                overlap,
                started,
            )
            return plain if measured else replace(plain, draft_confidence=None)
        self._insert_deferred(rows, eager)  # the draft below reads every row's context
        u = self._to_device(uniforms)  # no stream sync: an insert may be queued before it
        params = None if is_greedy else self._params_tensors(rows)
        draws: _Draws | None = None  # synthetic mode: the step's runs (and confidence)
        if on_device:
            self._check_scorable()
        offsets = torch.arange(self.block_size, device=self.device)
        drafts, draft_probs, drafted_confidence = self._drafted(
            last, start, spec_tokens, params, u, eager, measured
        )
        if drafted_confidence is not None:
            confidence = drafted_confidence
        verified: torch.Tensor | None = None  # on the device: k per row [B]
        plan = None
        if on_device:
            assert scoring is not None
            queued = time.perf_counter()
            plan = scoring()  # the host's part, while the device drafts
        if plan is not None:
            score_on = confidence
            if self.synthetic is not None:
                draws = self._draws(rows, measured)
                assert draws.confidence is not None, "checked above"
                score_on = self._staged(draws.confidence)
            ids = self._verify_ids(last, drafts, width)
            logits, verified = self._verify_allocated(
                ids, start[:, None] + offsets[:width], plan, spec_tokens, score_on, eager
            )
            logits = logits[:, : widest + 1]
            num_draft = verified
            if self.synthetic is not None:  # the next step's draws, while the device verifies
                self._draw_ahead(rows, measured)
            # No wait; the host's share: the scoring, queueing the allocation and the verify.
            self.last_two_phase_s = (0.0, time.perf_counter() - queued)
        if allocate is not None and widest > 0:
            drawn = None
            if self.synthetic is not None:
                draws = self._draws(rows, measured)
                drawn = draws.confidence
            if before_allocate is not None:
                before_allocate()
            waiting = time.perf_counter()
            host_confidence = confidence.cpu()  # the sync: the draft has run
            synced = time.perf_counter()
            spec_tokens = self._allocated(allocate, host_confidence, spec_tokens, drawn)
            widest = max(spec_tokens)
            width = widest + 1 if not self.use_cuda_graphs else padded_size(widest + 1, self.widths)
            num_draft = torch.tensor(spec_tokens, device=self.device)
            drafts, confidence = drafts[:, :widest], confidence[:, :widest]
            if draft_probs is not None:
                draft_probs = draft_probs[:, :widest]
        if verified is None:
            logits = self._verified(last, drafts, start, width, spec_tokens, eager)
        if allocate is not None and widest > 0:
            self.last_two_phase_s = (synced - waiting, time.perf_counter() - synced)
        if self.synthetic is not None:
            if draws is None:  # drawn now, while the device runs the verify
                draws = self._draws(rows, measured)
            result = self._synthetic_result(
                rows, spec_tokens, drafts, logits, params, u, started, draws, overlap, verified
            )
            return replace(result, on_device=verified is not None)
        accepted, bonus = self._accepted(drafts, num_draft, logits, params, draft_probs, u)
        packed = self._packed(accepted, drafts, bonus, confidence, verified)
        if overlap is not None:
            overlap()
        host_packed = packed.cpu()  # the sync
        drafted = spec_tokens
        if verified is not None:
            spec_tokens = host_packed[:, -1].tolist()
        result = self._unpack(host_packed, spec_tokens, widest, self._clock() - started, drafted)
        result = replace(result, on_device=verified is not None)
        return result if measured else replace(result, draft_confidence=None)

    def _drafted(
        self,
        last: torch.Tensor,
        start: torch.Tensor,
        spec_tokens: list[int],
        params: tuple[torch.Tensor, ...] | None,
        u: torch.Tensor,
        eager: bool,
        measured: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The draft forward of a step (none when no row drafts): each row's block is its last
        token then mask tokens; the drafts [B, widest] (argmax, or sampled with the step's
        draft uniforms), their distributions when sampling, and (``measured``) the draft's
        confidence [B, widest]."""
        rows, widest = last.shape[0], max(spec_tokens)
        drafts = torch.zeros(rows, widest, dtype=torch.long, device=self.device)
        if widest == 0:
            return drafts, None, None
        offsets = torch.arange(self.block_size, device=self.device)
        block = torch.full(
            (rows, self.block_size), self.mask_token_id, dtype=torch.long, device=self.device
        )
        block[:, 0] = last
        draft_logits = self._run_draft(block, start[:, None] + offsets, spec_tokens, eager)[
            :, :widest
        ]
        if params is None:  # greedy: the argmax and its probability in one pass
            drafts, confidence = self._top1(draft_logits, measured)
            return drafts, None, confidence
        draft_probs = sampling_probs(draft_logits, *params)
        drafts = sample_from_probs(draft_probs, u[:, :widest])
        confidence = self._confidence(draft_logits, draft_probs, params) if measured else None
        return drafts, draft_probs, confidence

    def _top1(
        self, logits: torch.Tensor, with_prob: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Argmax [B, W] of logits [B, W, vocab] and (``with_prob``) its probability."""
        return top1(logits, with_prob) if self.fused_top1 else top1_reference(logits, with_prob)

    def _verified(
        self,
        last: torch.Tensor,
        drafts: torch.Tensor,
        start: torch.Tensor,
        width: int,
        spec_tokens: list[int],
        eager: bool,
    ) -> torch.Tensor:
        """The verify forward of each row's last token and drafts (padded to ``width``):
        logits [B, widest + 1, vocab]."""
        ids = self._verify_ids(last, drafts, width)
        positions = start[:, None] + torch.arange(width, device=self.device)
        return self._run_verify(ids, positions, spec_tokens, eager)[:, : drafts.shape[1] + 1]

    @staticmethod
    def _verify_ids(last: torch.Tensor, drafts: torch.Tensor, width: int) -> torch.Tensor:
        """A verify's input ids [B, width]: each row's last token, its drafts, zeros after."""
        ids = torch.cat([last[:, None], drafts], dim=1)
        if width > ids.shape[1]:
            ids = torch.cat([ids, ids.new_zeros(ids.shape[0], width - ids.shape[1])], dim=1)
        return ids

    def _accepted(
        self,
        drafts: torch.Tensor,
        num_draft: torch.Tensor,
        logits: torch.Tensor,
        params: tuple[torch.Tensor, ...] | None,
        draft_probs: torch.Tensor | None,
        u: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's accepted prefix of its drafts [B, widest] and its bonus token [B]:
        greedy (``verify_greedy``) or speculative sampling with the step's accept and bonus
        uniforms (``verify_rejection``)."""
        if params is None:
            return verify_greedy(drafts, num_draft, logits.argmax(dim=-1))
        widest = drafts.shape[1]
        target_probs = sampling_probs(logits, *params)
        if draft_probs is None:
            draft_probs = target_probs.new_zeros(drafts.shape[0], 0, target_probs.shape[-1])
        return verify_rejection(
            drafts,
            num_draft,
            draft_probs,
            target_probs,
            u[:, self.block_size : self.block_size + widest],
            u[:, -1],
        )

    @staticmethod
    def _packed(
        accepted: torch.Tensor,
        drafts: torch.Tensor,
        bonus: torch.Tensor,
        confidence: torch.Tensor,
        verified: torch.Tensor | None,
    ) -> torch.Tensor:
        """What a step copies to the host, one row each: [accepted (widest), drafts (widest),
        bonus, confidence (fixed point, 1e-6 steps), and what the row verified when the
        device allocated it] (``_unpack`` reads it)."""
        fixed = (confidence * CONFIDENCE_SCALE).round().long()
        parts = [accepted.long(), drafts, bonus[:, None], fixed]
        if verified is not None:
            parts.append(verified[:, None])
        return torch.cat(parts, dim=1)

    @torch.inference_mode()
    def spec_steps(
        self,
        rows: list[Request],
        spec_tokens: list[int],
        uniforms: torch.Tensor,
        overlap: Callable[[], None] | None = None,
        scoring: Callable[[], SlotScoring | None] | None = None,
    ) -> list[StepResult]:
        """``len(uniforms)`` drafting steps of ``rows`` at ``spec_tokens`` (some row > 0)
        queued back to back with one sync at the end: step i's last token is step i - 1's
        bonus and its start that step's start plus its accept length, both on the device, so
        the device drafts and verifies without waiting for the host between the steps.
        ``uniforms`` [steps, B, 2 * block_size + 1] (CPU), each step's as ``step`` takes them.
        The same tokens and accept masks as that many ``step`` calls at these k with those
        uniforms; the caller drops a row's tokens after its stop token or length limit
        (``Request.append``: the later steps are scratch). Each row must have room for
        ``steps * (k + 1)`` more positions (its ``num_remaining``: ``Engine._burst_plan``
        caps the burst so). Each result is one step's; ``step_time_s`` the burst's time over
        ``steps``. ``overlap``: as ``step``'s, run once every step is queued. Synthetic
        acceptance: each step's runs are drawn on the host (they are functions of each row's
        key and step index) once its forwards are queued and go to the device without a sync;
        a row then accepts min(k, run) drafts and emits the target's token there, as a single
        synthetic step.

        ``scoring``: device-allocated steps (``step``'s ``scoring``): asked once, while the
        first draft runs; every step drafts ``spec_tokens`` and the device fills the draft
        slots the scoring's budget pays for from that step's own confidence (one scoring, one
        budget for the whole burst, its tables uploaded once), so a two-phase step needs no
        host round trip either. Each result's ``spec_tokens`` are what its rows verified and
        ``on_device`` is set. ``scoring()`` None: every row verifies what it drafted."""
        steps = int(uniforms.shape[0]) if uniforms.dim() == 3 else 0
        widest = max(spec_tokens, default=0)
        if steps < 1 or uniforms.shape[1] != len(rows) or len(spec_tokens) != len(rows):
            raise ValueError(
                f"uniforms {tuple(uniforms.shape)}: [steps >= 1, rows={len(rows)}, uniforms], "
                f"and one k per row ({len(spec_tokens)} given)"
            )
        if widest == 0:
            raise ValueError("spec_steps drafts: it needs some k > 0")
        if scoring is not None:
            self._check_scorable()
        started = self._clock()
        measured = self.measure_confidence or scoring is not None
        width = widest + 1 if not self.use_cuda_graphs else padded_size(widest + 1, self.widths)
        host = torch.tensor(
            [[r.last_token, r.position, k] for r, k in zip(rows, spec_tokens, strict=True)]
        )
        last, start, num_draft = host.to(self.device).unbind(1)
        self._insert_deferred(rows, False)  # the drafts below read every row's context
        params = None
        if not all(r.params.temperature <= 0 for r in rows):
            params = self._params_tensors(rows)
        drawn = self._to_device(uniforms)
        offsets = torch.arange(width, device=self.device)
        draws: list[_Draws] = []  # synthetic mode: each step's runs (and confidence)
        no_confidence = torch.zeros(len(rows), 0, device=self.device)
        plan: SlotScoring | None = None
        self.last_two_phase_s = (0.0, 0.0)
        queueing_s = 0.0  # device-allocated: the host's scoring and allocations' launches
        out = []
        for i in range(steps):
            u = drawn[i]
            drafts, draft_probs, confidence = self._drafted(
                last, start, spec_tokens, params, u, False, measured
            )
            queued = time.perf_counter()
            if scoring is not None and i == 0:
                plan = scoring()  # the host's part, while the device drafts
            verified: torch.Tensor | None = None  # on the device: k per row [B]
            if plan is not None:
                assert confidence is not None, "a device-allocated step measures it"
                score_on = confidence
                if self.synthetic is not None:  # drawn while the device drafts; a fresh
                    # pinned copy per step (a reused staging buffer could change under a copy)
                    draws.append(self._drawn(self._draw_rows(rows, i), measured))
                    assert draws[-1].confidence is not None, "checked above"
                    score_on = self._to_device(torch.from_numpy(draws[-1].confidence))
                ids = self._verify_ids(last, drafts, width)
                logits, verified = self._verify_allocated(
                    ids, start[:, None] + offsets, plan, spec_tokens, score_on, False, i == 0
                )
                logits = logits[:, : widest + 1]
                queueing_s += time.perf_counter() - queued
            else:
                logits = self._verified(last, drafts, start, width, spec_tokens, False)
            verifies = num_draft if verified is None else verified
            extra = [] if verified is None else [verified[:, None]]
            if self.synthetic is not None:  # drawn decisions: min(k, run) drafts, the target's
                if verified is None:
                    # Step i's runs are drawn on the host while the device runs its draft and
                    # verify (queued above), and go up without a sync; drawn all before the
                    # first launch, they kept the device idle for the whole burst's draws.
                    draws.append(self._drawn(self._draw_rows(rows, i), measured))
                runs = self._to_device(torch.from_numpy(draws[-1].runs))
                targets = self._synthetic_targets(logits, params, u)
                count = torch.minimum(runs, verifies)
                last = targets.gather(1, count[:, None]).squeeze(1)
                out.append(torch.cat([drafts, targets, *extra], dim=1))
                start = start + count + 1
                continue
            accepted, bonus = self._accepted(drafts, verifies, logits, params, draft_probs, u)
            out.append(
                self._packed(
                    accepted,
                    drafts,
                    bonus,
                    no_confidence if confidence is None else confidence,
                    verified,
                )
            )
            last, start = bonus, start + accepted.sum(dim=1) + 1
        if overlap is not None:
            overlap()
        host_packed = torch.stack(out).cpu()  # the sync
        elapsed_s = (self._clock() - started) / steps
        if plan is not None:  # (no wait: the host's share, as a single step reports it)
            self.last_two_phase_s = (0.0, queueing_s)
        drafted = None if plan is None else spec_tokens
        results = []
        for i, packed in enumerate(host_packed):
            ks = spec_tokens if plan is None else packed[:, -1].tolist()
            if draws:
                result = self._drawn_result(
                    packed.tolist(), ks, widest, elapsed_s, draws[i], drafted
                )
            else:
                result = self._unpack(packed, ks, widest, elapsed_s, drafted)
            results.append(replace(result, on_device=plan is not None))
        return results if measured else [replace(r, draft_confidence=None) for r in results]

    def _check_scorable(self) -> None:
        """A device-allocated step scores the draft's confidence: refuse synthetic acceptance
        that draws none."""
        if self.synthetic is not None and self.synthetic.confidence_auc is None:
            raise ValueError(
                "a device-allocated step scores the draft's confidence: this synthetic "
                "acceptance draws none (give it a confidence_auc)"
            )

    @torch.inference_mode()
    def plain_steps(
        self,
        rows: list[Request],
        uniforms: torch.Tensor,
        overlap: Callable[[], None] | None = None,
    ) -> list[StepResult]:
        """``len(uniforms)`` plain steps of ``rows`` (every row at k = 0) queued back to back
        with one sync at the end: each step's input token is the previous step's, fed on the
        device, so the device runs the steps without waiting for the host between them.
        ``uniforms`` [steps, B, 2 * block_size + 1] (CPU): step i's, as ``step`` takes them
        (only the bonus uniform is read). The same tokens as that many ``step`` calls at
        k = 0 with those uniforms; the caller drops a row's tokens after its stop token or
        length limit (``Request.append``): the steps after them are scratch, as a dropped
        step's are. Rows must have room in the caches for ``steps`` more positions (the
        engine's ``max_seq_len`` leaves at least ``block_size`` beyond every request).
        Each result is one step's; its ``step_time_s`` is the burst's time over ``steps``.
        ``overlap``: as ``step``'s, run once every step is queued."""
        steps = int(uniforms.shape[0]) if uniforms.dim() == 3 else 0
        if not 1 <= steps <= DEFERRED_POSITIONS or uniforms.shape[1] != len(rows):
            raise ValueError(
                f"uniforms {tuple(uniforms.shape)}: [steps, rows={len(rows)}, uniforms] with "
                f"1 <= steps <= {DEFERRED_POSITIONS}"
            )
        if not self.plain_fast_path:  # (synthetic acceptance draws nothing at k = 0)
            raise ValueError("plain_steps needs the plain fast path (plain_fast_path is off)")
        started = self._clock()
        host = torch.tensor([[r.last_token, r.position, r.pending_context] for r in rows])
        last, start, pending = host.to(self.device).unbind(1)
        is_greedy = all(r.params.temperature <= 0 for r in rows)
        tokens = self._plain_tokens(
            rows, last, start, pending, uniforms[:, :, -1], is_greedy, False, overlap
        )
        elapsed_s = (self._clock() - started) / steps
        plain = [0] * len(rows)
        return [self._unpack(tokens[:, i : i + 1], plain, 0, elapsed_s) for i in range(steps)]

    @torch.inference_mode()
    def plain_queue(
        self,
        rows: list[Request],
        steps: int,
        after: PlainBurst | None = None,
        bonus: torch.Tensor | None = None,
    ) -> PlainBurst:
        """``steps`` plain steps of ``rows`` queued on the device, not read (``plain_collect``
        reads them): ``plain_steps`` cut in two, so the host may queue the next burst before
        it reads this one and the device runs them back to back. ``after``: a queued burst of
        the same rows this one follows (its tokens, positions and stash columns stay on the
        device, its rows' sampling settings are reused: nothing here waits for it). ``bonus``
        [steps, B] (CPU): each step's bonus uniform per row, as ``plain_steps`` reads them
        (needed when a row samples; greedy rows ignore it). The caller keeps every row's
        length and cache room for both bursts; a row that ends inside ``after`` (a stop token)
        runs scratch steps here, as a burst's steps past a row's end do."""
        if not 1 <= steps <= DEFERRED_POSITIONS:
            raise ValueError(f"steps={steps}: 1 to {DEFERRED_POSITIONS}")
        if not self.plain_fast_path:
            raise ValueError("plain_queue needs the plain fast path (plain_fast_path is off)")
        is_greedy = all(r.params.temperature <= 0 for r in rows)
        if not is_greedy and (bonus is None or tuple(bonus.shape) != (steps, len(rows))):
            raise ValueError(f"a sampled row needs bonus uniforms [steps={steps}, {len(rows)}]")
        if after is not None and [id(r) for r in after.rows] != [id(r) for r in rows]:
            raise ValueError("a burst queued after another must have the same rows")
        started = time.perf_counter()  # (not ``_clock``: it waits for the device)
        if after is None:
            host = torch.tensor([[r.last_token, r.position, r.pending_context] for r in rows])
            last, start, pending = host.to(self.device).unbind(1)
            positions = [r.position for r in rows]
            stash = [r.pending_context for r in rows]
        else:
            last, start, pending = after.last, after.start, after.pending
            positions, stash = after.positions, after.stash
        defer = self.defer_context
        if defer and any(column + steps > DEFERRED_POSITIONS for column in stash):
            self._insert_stash(positions, stash, ahead=after is not None)
            pending = torch.zeros_like(pending)
            stash = [0] * len(rows)
        params = None
        if not is_greedy:  # (made while nothing is queued: a pageable copy would wait)
            params = after.params if after is not None else None
            params = params or self._params_tensors(rows)
        drawn = torch.zeros(steps, len(rows)) if bonus is None else bonus
        tokens = self._queue_plain_tokens(
            rows, last, start, pending, drawn, is_greedy, False, params
        )
        stashed = steps if defer else 0
        host_tokens, ready = tokens, None
        if self.device.type == "cuda":  # (a plain .cpu() later would wait for what follows)
            host_tokens = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host_tokens.copy_(tokens, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        return PlainBurst(
            rows,
            tokens,
            steps,
            params,
            tokens[:, -1],
            start + steps,
            pending + stashed,
            [position + steps for position in positions],
            [column + stashed for column in stash],
            started,
            host_tokens,
            ready,
        )

    def plain_collect(
        self,
        burst: PlainBurst,
        overlap: Callable[[], None] | None = None,
        then: PlainBurst | None = None,
    ) -> list[StepResult]:
        """A queued burst's steps (``plain_queue``): ``overlap`` runs first, then the one sync;
        every row's stash count set to what the burst leaves. ``then``: the burst queued
        after it, whose time starts now (the device runs it from here). Each result's
        ``step_time_s`` is the burst's time over its steps."""
        if overlap is not None:
            overlap()
        if burst.ready is not None:
            burst.ready.synchronize()  # the sync: this burst's tokens, not what follows it
        host_tokens = burst.host.cpu()
        now = time.perf_counter()  # (the burst's end: its tokens are in)
        for row, column in zip(burst.rows, burst.stash, strict=True):
            row.pending_context = column
        if then is not None:
            then.started = now
        elapsed_s = (now - burst.started) / burst.steps
        plain = [0] * len(burst.rows)
        return [
            self._unpack(host_tokens[:, i : i + 1], plain, 0, elapsed_s) for i in range(burst.steps)
        ]

    def _plain_step(
        self,
        rows: list[Request],
        spec_tokens: list[int],
        last: torch.Tensor,
        start: torch.Tensor,
        pending: torch.Tensor,
        uniforms: torch.Tensor,
        is_greedy: bool,
        eager: bool,
        overlap: Callable[[], None] | None,
        started: float,
    ) -> StepResult:
        """``step`` with every row at k = 0 (``_plain_tokens`` for one step): skips what the
        general step builds for drafts (the block, the draft's uniforms, the acceptance
        kernels): the host work between two plain steps is the device's idle time at batch 1."""
        tokens = self._plain_tokens(
            rows, last, start, pending, uniforms[None, :, -1], is_greedy, eager, overlap
        )
        return self._unpack(tokens, spec_tokens, 0, self._clock() - started)

    def _plain_tokens(
        self,
        rows: list[Request],
        last: torch.Tensor,
        start: torch.Tensor,
        pending: torch.Tensor,
        bonus_uniforms: torch.Tensor,
        is_greedy: bool,
        eager: bool,
        overlap: Callable[[], None] | None,
    ) -> torch.Tensor:
        """``steps = len(bonus_uniforms)`` plain steps queued back to back, each row's next
        token the target's after its last one — greedy, the argmax (what ``verify_greedy``
        gives with no drafts); sampled, drawn from the target's probabilities with the row's
        bonus uniform of that step (what ``verify_rejection`` draws with no drafts: nothing
        to reject, the residual is the target's distribution) — with the draft context
        updated by the verify forward as on every step. Returns the tokens [B, steps] on the
        host (the one sync, after ``overlap``).

        With ``defer_context`` (not ``eager``: the culprit search's probes insert as usual,
        at scratch positions) each row's features go to its stash columns ``pending`` onwards
        instead of the draft's context; a row whose stash has no room for the steps has it
        inserted first."""
        steps = bonus_uniforms.shape[0]
        defer = self.defer_context and not eager
        if defer and any(r.pending_context + steps > DEFERRED_POSITIONS for r in rows):
            self._insert_deferred(rows, eager)
            pending = torch.zeros_like(pending)
        tokens = self._queue_plain_tokens(
            rows, last, start, pending, bonus_uniforms, is_greedy, eager
        )
        return self._plain_sync(rows, tokens, steps if defer else 0, overlap)

    def _queue_plain_tokens(
        self,
        rows: list[Request],
        last: torch.Tensor,
        start: torch.Tensor,
        pending: torch.Tensor,
        bonus_uniforms: torch.Tensor,
        is_greedy: bool,
        eager: bool,
        params: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        """``_plain_tokens``'s steps queued (every row's stash with room for them): the
        tokens [B, steps] on the device, in a tensor of their own (a later replay of the same
        graph leaves them be). ``params``: the rows' sampling settings on the device, if
        made already."""
        steps = bonus_uniforms.shape[0]
        defer = self.defer_context and not eager
        graph = self._burst_graph(len(rows), steps) if defer and is_greedy else None
        if graph is not None:
            # Padded rows start at position 0 and stash column 0 of their free slots, so every
            # step of the burst writes scratch within bounds. The tokens are copied out of the
            # graph's buffer before ``overlap`` (which may replay a graph).
            batch = graph.static_inputs[0].shape[0]
            inputs = torch.zeros(3, batch, dtype=torch.long, device=self.device)
            inputs[:, : len(rows)] = torch.stack([last, start, pending])
            tokens = graph(inputs[0, :, None], inputs[1, :, None], inputs[2])[: len(rows)]
            return tokens.clone()
        if not is_greedy and params is None:
            params = self._params_tensors(rows)
        drawn = None if is_greedy else self._to_device(bonus_uniforms)
        ids, positions, columns = last[:, None], start[:, None], pending
        plain = [0] * len(rows)
        out = []
        for i in range(steps):
            if i:
                positions, columns = positions + 1, columns + 1
            if defer:
                logits = self._run_stashing_verify(ids, positions, columns)
            else:
                logits = self._run_verify(ids, positions, plain, eager)[:, :1]
            if params is None or drawn is None:
                ids = logits.argmax(dim=-1)  # [B, 1]: the packed layout of 0 drafts
            else:
                probs = sampling_probs(logits, *params)
                ids = sample_from_probs(probs[:, 0], drawn[i])[:, None]
            out.append(ids)
        return out[0] if steps == 1 else torch.cat(out, dim=1)

    def _plain_sync(
        self,
        rows: list[Request],
        tokens: torch.Tensor,
        stashed: int,
        overlap: Callable[[], None] | None,
    ) -> torch.Tensor:
        """The end of ``_plain_tokens``: ``overlap``, then the tokens [B, steps] to the host
        (the one sync); each row's stash holds ``stashed`` more columns."""
        if overlap is not None:
            overlap()
        host_tokens = tokens.cpu()  # the sync
        for row in rows:
            row.pending_context += stashed
        return host_tokens

    def _burst_graph(self, rows: int, steps: int) -> StaticCall | None:
        """The plain-burst graph for ``rows`` rows and ``steps`` greedy steps, if captured
        and in use (``burst_graphs``)."""
        if not (self.use_cuda_graphs and self.burst_graphs and steps == self.plain_burst_graph):
            return None
        return self._graphs.get(("stash_burst", padded_size(rows, self.batch_sizes), steps))

    def _run_stashing_verify(
        self, ids: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor
    ) -> torch.Tensor:
        """``_stashing_verify_forward``: a graph replay, or eagerly without graphs. Logits
        [B, 1, vocab]."""
        rows = ids.shape[0]
        if self.use_cuda_graphs:
            graph = self._graphs["stash", padded_size(rows, self.batch_sizes), 1]
            return graph(ids, positions, columns)[:rows]
        with self._eager_forward():
            return self._stashing_verify(ids, positions, columns)

    def _insert_deferred(self, rows: list[Request], eager: bool) -> None:
        """Insert every row's stashed context (``defer_context``) into the draft's cache at
        its positions, one forward for the batch; a column a row has not filled writes at the
        row's position, scratch until it advances. Afterwards no row has any pending."""
        if self._stash is None or not any(r.pending_context for r in rows):
            return
        self._insert_stash(
            [r.position for r in rows], [r.pending_context for r in rows], eager=eager
        )
        for row in rows:
            row.pending_context = 0

    def _insert_stash(
        self, positions: list[int], stash: list[int], eager: bool = False, ahead: bool = False
    ) -> None:
        """``_insert_deferred`` for rows at ``positions`` with ``stash`` columns filled (each
        column i < stash at position - stash + i, the rest at the position: scratch).
        ``ahead``: queued behind work the host has not read (the positions go through pinned
        memory: a copy from pageable memory would wait for that work)."""
        host = torch.empty(len(positions), DEFERRED_POSITIONS, dtype=torch.long)
        for index, (position, columns) in enumerate(zip(positions, stash, strict=True)):
            host[index] = position
            if columns:
                host[index, :columns] = torch.arange(position - columns, position)
        on_device = self._to_device(host) if ahead else host.to(self.device)
        if self.use_cuda_graphs and not eager:
            batch = padded_size(len(positions), self.batch_sizes)
            self._graphs["insert_stash", batch, DEFERRED_POSITIONS](on_device)
        else:
            self._insert_stash_forward(on_device)

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor to the device without waiting for the stream (through pinned memory:
        a copy from pageable memory waits for the work queued before it)."""
        if self.device.type != "cuda":
            return tensor.to(self.device)
        if not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def _staged(self, values: np.ndarray) -> torch.Tensor:
        """Synthetic mode's drawn confidence [rows, K] in a reused host buffer (pinned on a
        CUDA device), for the device allocation to copy without a sync."""
        rows, positions = values.shape
        staging = self._confidence_staging
        if staging is None or staging.shape[0] < rows or staging.shape[1] != positions:
            staging = torch.zeros(max(rows, self.batch_sizes[-1]), positions, dtype=torch.float64)
            if self.device.type == "cuda":
                staging = staging.pin_memory()
            self._confidence_staging = staging
        staging.numpy()[:rows] = values
        return staging[:rows]

    def _verify_allocated(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        plan: SlotScoring,
        drafted: list[int],
        confidence: torch.Tensor,
        eager: bool,
        upload: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A device-allocated step's verify: logits [B, W, vocab] and k per row [B] (device).
        ``upload`` False: a drafting burst's later step, whose tables the allocation graph
        already holds (``AllocationGraphs.run``).
        With a ragged graph for the step's tokens (``plan.budget`` drafts beyond each row's
        own token, rounded up to a bucket) the device fills every draft slot the bucket pays
        for and packs the index itself, one graph replay (``AllocationGraphs``); a padded
        replay verifies every drafted slot; the eager forward (CPU, the culprit search)
        allocates ``budget`` and packs on the host."""
        rows, width = ids.shape
        budget = plan.budget
        if self.verify_mode == "ragged" and self._ragged_graphs and not eager:
            batch = padded_size(rows, self.batch_sizes)
            num_tokens = self.ragged_shapes.choose([rows + budget], batch, width)
            if num_tokens is not None:
                verified, index = self._allocation_graphs.run(
                    plan, drafted, confidence, batch, width, num_tokens, upload
                )
                graph = self._ragged_graphs[batch, width, num_tokens]
                return graph(ids, positions, index)[:rows], verified
        scored = DeviceScoring.upload(plan, drafted, self.device, self._to_device)
        if confidence.device.type == "cpu":  # synthetic mode's staged draws
            confidence = self._to_device(confidence)
        if self.use_cuda_graphs and not eager:
            verified = scored.allocate(confidence, rows * (width - 1))
            return self._run("verify", ids, positions), verified
        verified = scored.allocate(confidence, budget)
        packing = None
        if self.pack_ragged:  # each row's k + 1 tokens of the step's width
            packing = Packing.from_lengths(verified + 1, width)
        return self._run("verify", ids, positions, packing, eager=eager), verified

    def _confidence(
        self,
        logits: torch.Tensor,
        probs: torch.Tensor | None,
        params: tuple[torch.Tensor, ...] | None,
    ) -> torch.Tensor:
        """[B, k] top-1 draft probability: of the raw logits for greedy rows (``_top1``), of
        the distribution a sampling row samples from (greedy rows' is one-hot)."""
        confidence = self._top1(logits, True)[1]
        assert confidence is not None
        if probs is None or params is None:
            return confidence
        return torch.where((params[0] > 0)[:, None], probs.amax(dim=-1), confidence)

    @staticmethod
    def _allocated(
        allocate: Allocate,
        confidence: torch.Tensor,
        drafted: list[int],
        drawn: np.ndarray | None = None,
    ) -> list[int]:
        """The k each row verifies, from its drafted positions' confidence (host sync).
        ``drawn``: synthetic mode's confidence [B, >= widest], given to ``allocate`` in place
        of the draft's own (which is still copied: the step's cost stays real)."""
        # One array, sliced per row (no Python floats: this runs between draft and verify).
        values = drawn if drawn is not None else confidence.cpu().numpy()
        values = values.astype(np.float64, copy=False)
        rows: list[PositionValues] = [values[i, :k] for i, k in enumerate(drafted)]
        chosen = [int(k) for k in allocate(rows)]
        if len(chosen) != len(drafted) or any(
            not 0 <= k <= d for k, d in zip(chosen, drafted, strict=True)
        ):
            raise ValueError(f"allocation {chosen} does not fit the drafted k {drafted}")
        return chosen

    def _synthetic_result(
        self,
        rows: list[Request],
        spec_tokens: list[int],
        drafts: torch.Tensor,
        logits: torch.Tensor,
        params: tuple[torch.Tensor, ...] | None,
        u: torch.Tensor,
        started: float,
        draws: _Draws,
        overlap: Callable[[], None] | None = None,
        verified: torch.Tensor | None = None,
    ) -> StepResult:
        """Synthetic acceptance: a row accepts min(k, drawn run) drafts, then emits the target's
        own token at the first rejected position (its argmax, or a sample of its distribution
        there with the bonus uniform). Every forward ran as usual; only the decision is drawn,
        and so is the draft confidence the step reports (when it measures it). ``verified``:
        a device-allocated step's k per row (the reported confidence then covers what each
        row drafted)."""
        targets = self._synthetic_targets(logits, params, u)
        parts = [drafts, targets] if verified is None else [drafts, targets, verified[:, None]]
        if overlap is not None:
            overlap()
        packed = torch.cat(parts, dim=1).cpu()  # the sync
        drafted = spec_tokens
        if verified is not None:
            spec_tokens = packed[:, -1].tolist()
        elapsed_s = self._clock() - started
        return self._drawn_result(
            packed.tolist(), spec_tokens, drafts.shape[1], elapsed_s, draws, drafted
        )

    @staticmethod
    def _synthetic_targets(
        logits: torch.Tensor, params: tuple[torch.Tensor, ...] | None, u: torch.Tensor
    ) -> torch.Tensor:
        """The target's token at every position [B, widest + 1]: its argmax, or a sample of
        its distribution there with the step's bonus uniform."""
        if params is None:
            return logits.argmax(dim=-1)
        probs = sampling_probs(logits, *params)
        return sample_from_probs(probs, u[:, -1:].expand(-1, probs.shape[1]))

    @staticmethod
    def _drawn_result(
        packed: list[list[int]],
        spec_tokens: list[int],
        widest: int,
        elapsed_s: float,
        draws: _Draws,
        drafted: list[int] | None = None,
    ) -> StepResult:
        """A synthetic step's result from its copied [drafts, targets] rows and its draws
        (``drafted``: the positions each row's reported confidence covers; default its k)."""
        accepted, tokens = assemble_rows(packed, spec_tokens, draws.runs.tolist(), widest)
        confidence = None
        if draws.confidence is not None:
            values = draws.confidence.tolist()
            covered = spec_tokens if drafted is None else drafted
            confidence = [row[:k] for row, k in zip(values, covered, strict=True)]
        return StepResult(accepted, tokens, elapsed_s, confidence, spec_tokens)

    def _draws(self, rows: list[Request], measured: bool) -> _Draws:
        """Synthetic mode's host draws for a step (no device sync): each row's run over every
        position and, when the step measures confidence, the synthetic confidence [B, K].
        Taken from ``_draw_ahead`` when it made them for exactly these rows at these steps
        (the draws are functions of (key, step): the same values either way)."""
        rows_at = self._draw_rows(rows, 0)
        ahead, self._draws_ahead = self._draws_ahead, None
        if ahead is not None and ahead[0] == rows_at and (ahead[1] or not measured):
            self.draws_ahead_used += 1
            return ahead[2] if measured else _Draws(ahead[2].runs, None)
        return self._drawn(rows_at, measured)

    def _draw_ahead(self, rows: list[Request], measured: bool) -> None:
        """A device-allocated step's rows draw their next step now, while the device verifies:
        a device-allocated step scores its draws between the draft and the verify, host time
        (0.25-0.4 ms at 1-64 rows) a real engine, whose confidence comes from the draft's
        logits on the device, never spends there. Used when the next step has these rows."""
        rows_at = self._draw_rows(rows, 1)
        self._draws_ahead = (rows_at, measured, self._drawn(rows_at, measured))

    def _draw_rows(self, rows: list[Request], ahead: int) -> tuple[tuple[str, str, int], ...]:
        """(task, key, step) per row; the step is the index the controller saw, plus ``ahead``."""
        synthetic = self.synthetic
        assert synthetic is not None, "only called in synthetic mode"
        return tuple(
            (*synthetic.identity(r.request_id, r.context), len(r.accept_lengths) + ahead)
            for r in rows
        )

    def _drawn(self, rows_at: tuple[tuple[str, str, int], ...], measured: bool) -> _Draws:
        synthetic = self.synthetic
        assert synthetic is not None, "only called in synthetic mode"
        tasks = [task for task, _, _ in rows_at]
        keys = [key for _, key, _ in rows_at]
        steps = [step for _, _, step in rows_at]
        positions = max_spec_tokens(self.block_size)
        runs = synthetic.accept_runs(tasks, keys, steps, positions)
        if not measured or synthetic.confidence_auc is None:
            return _Draws(runs, None)
        return _Draws(runs, synthetic.draft_confidence(keys, steps, runs, positions))

    def _verify_packing(self, spec_tokens: list[int]) -> Packing | None:
        """Eager steps whose rows verify different widths compute k + 1 tokens per row."""
        if not self.pack_ragged or min(spec_tokens) == max(spec_tokens):
            return None
        lengths = torch.tensor([k + 1 for k in spec_tokens], device=self.device)
        return Packing.from_lengths(lengths, max(spec_tokens) + 1)

    def _draft_packings(self, spec_tokens: list[int]) -> tuple[Packing | None, Packing | None]:
        """Eager steps draft only the rows with k > 0 and only the k logits each one uses."""
        if not self.pack_ragged:
            return None, None
        k = torch.tensor(spec_tokens, device=self.device)
        rows = (
            Packing((k > 0)[:, None].expand(-1, self.block_size)) if min(spec_tokens) == 0 else None
        )
        outputs = (
            None
            if min(spec_tokens) == max_spec_tokens(self.block_size)
            else Packing.from_lengths(k, max_spec_tokens(self.block_size))
        )
        return rows, outputs

    @contextlib.contextmanager
    def _eager_forward(self) -> Iterator[None]:
        """The settings of the forwards outside the CUDA graphs: their attention backends
        (``eager_attention``) and, with ``compile_scope: layer``, the plain layer steps
        (``plain_layer_steps``: the compiled ones serve the captured graphs, whose shapes are
        fixed)."""
        with eager_attention(self.device), plain_layer_steps(self.target, self.draft):
            yield

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @staticmethod
    def _unpack(
        packed: torch.Tensor,
        spec_tokens: list[int],
        widest: int,
        elapsed_s: float,
        drafted: list[int] | None = None,
    ) -> StepResult:
        """``drafted``: per row, the positions its confidence covers (default its k)."""
        if widest == 0 and drafted is None:  # a plain step: each row's one token
            tokens = packed[:, 0].tolist()
            return StepResult(
                [[] for _ in tokens],
                [[t] for t in tokens],
                elapsed_s,
                [[] for _ in tokens],
                spec_tokens,
            )
        accepted_rows, token_rows, confidence_rows = [], [], []
        bonus = 2 * widest  # [accepted (widest), drafts (widest), bonus, confidence (widest)]
        covered = spec_tokens if drafted is None else drafted
        for row, k, c in zip(packed.tolist(), spec_tokens, covered, strict=True):
            mask = [bool(x) for x in row[:k]]
            num_accepted = sum(mask)
            accepted_rows.append(mask)
            token_rows.append([*row[widest : widest + num_accepted], row[bonus]])
            confidence_rows.append([x / CONFIDENCE_SCALE for x in row[bonus + 1 : bonus + 1 + c]])
        return StepResult(accepted_rows, token_rows, elapsed_s, confidence_rows, spec_tokens)
