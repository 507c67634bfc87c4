"""The embedded engine's own step cost T(batch, width), measured at start-up and cached.

The goodput policy prices each k with a cost table. A table profiled on another machine (or
none: the relative fallback fitted to an H200) can rank k wrongly on this one — on a CPU a
width-8 verify costs several plain steps, on an H200 barely more than one. So when the policy
names no ``cost_table``, the embedded backend measures its own: whole engine steps (draft
forward, sampling and host work included, hence ``includes_draft``) for batch sizes 1, 2, 4, …
up to ``max_batch_size`` and the widths the policy can choose (1 = drafting off, then the
padded verify widths up to the block; on an engine that verifies each row at its own width,
width 2 and every fourth width as well, so that the draft forward's fixed cost sits between
widths 1 and 2 instead of being spread over the first drafted tokens), a few timed steps each
after an untimed first one. Every drafting step is timed with the whole block's draft logits
(the runner's ``narrow_drafts`` off): what a two-phase step, which drafts the whole block before
its rows' k are known, pays at every width. A one-phase step of k <= 7 on CUDA graphs costs
less (its draft computes 7 positions' logits), which the policy's online fit learns.

On a GPU's ragged engine the profile also times whole steps at every captured token count the
two-phase steps of 32 rows or more run (``CostTable.token_buckets``; the rows' k spread so that
they sum to the count). A GPU's verify climbs in stairs between the table's widths — its
matrix products run in tiles: on the H200 (8B shape, 64 rows) a step of 385-416 tokens took
1.8 ms more than one of 384, and 448 hardly more than 416 (session 22's harness timelines) —
which a line between widths 4 and 8 (256 and 512 tokens) hides; the budget rules that price
with the table (policies/baselines/ragged_cost.py) then stop just past a stair. The table is
cached by model and device (a hash of both configs, the weight files' sizes and
modification times, the device, torch's version and the engine's limits), so a restart reads
it in milliseconds; the online cost fit then refines it from live steps.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engines.embedded.engine import Engine
from engines.embedded.events import RequestView, SamplingParams, TokenEvent
from engines.embedded.request import Request
from policies.costmodel import CostTable, padded_width
from policies.types import max_spec_tokens

log = logging.getLogger(__name__)

PROFILE_VERSION = 6  # part of the cache key: a change of method re-measures (5: plain bursts per
# step; 6: drafting points one step a call under drafting bursts)
PROMPT_TOKENS = 32
TIMED_STEPS = 3
WIDTH_MULTIPLE = 8  # the goodput policy's default verify_width_multiple
BUCKET_MIN_BATCH = 32  # token buckets profiled from this batch size (two-phase steps' default)


def batch_sizes_for(max_batch_size: int) -> list[int]:
    """1, 2, 4, … and ``max_batch_size`` itself."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    sizes.append(max_batch_size)
    return sizes


def widths_for(
    block_size: int, multiple: int = WIDTH_MULTIPLE, per_row_widths: bool = False
) -> list[int]:
    """1 (drafting off) and every padded verify width up to k = block - 1.

    ``per_row_widths`` (ragged verifies): rows run at any width, so the table also holds width 2
    (k = 1) and every fourth width. A whole-step table interpolates linearly between its
    widths; with only 1 and 8 the draft forward (paid once a row drafts at all) is spread over
    the first seven drafted tokens of each row. On the H200 (8B shape, batch 1: 6.36 / 8.58 /
    8.70 ms at widths 1 / 8 / 16) that priced one of those tokens 20x what one more token past
    width 8 costs, and vLLM's budget rule priced with it verified far fewer drafts
    (bench/results/gpu_decisions_ragged.json, arm synthetic-8b-ragged-triton-engine).

    """
    k_max = max_spec_tokens(block_size)
    widths = {1, *(padded_width(k, multiple) for k in range(1, k_max + 1))}
    if per_row_widths and k_max >= 1:
        widths |= {2, *range(4, k_max + 2, 4)}
    return sorted(widths)


def profile_engine(
    engine: Engine,
    max_batch_size: int,
    on_point: Callable[[int, int, float], None] | None = None,
    on_bucket: Callable[[int, int, float], None] | None = None,
) -> CostTable:
    """The engine's start-up profile: whole steps per (batch size, width) (``profile_steps``
    over ``batch_sizes_for`` and ``widths_for``) and, on a GPU's ragged engine, per captured
    token count from 32 rows (``profile_token_buckets``)."""
    runner = engine.runner
    table = profile_steps(
        engine,
        batch_sizes_for(max_batch_size),
        widths_for(engine.block_size, per_row_widths=runner.per_row_widths),
        on_point=on_point,
    )
    points = bucket_points(engine)
    if not points:
        return table
    return replace(table, token_buckets=profile_token_buckets(engine, points, on_point=on_bucket))


def profile_steps(
    engine: Engine,
    batch_sizes: Sequence[int],
    widths: Sequence[int],
    timed_steps: int = TIMED_STEPS,
    on_point: Callable[[int, int, float], None] | None = None,
) -> CostTable:
    """Median wall time of ``timed_steps`` engine steps per (batch size, width): every row at
    k = width - 1, no request admitted during the timed steps. The engine must be idle."""
    vocab = engine.runner.target.shape.vocab_size
    rng = random.Random(0)
    rows: list[list[float]] = []
    with _profiling(engine):
        for batch in batch_sizes:
            row = []
            for width in widths:
                seconds = _time_point(engine, batch, width - 1, timed_steps, vocab, rng)
                row.append(seconds)
                if on_point is not None:
                    on_point(batch, width, seconds)
            rows.append(row)
    batch_sizes = list(batch_sizes)
    if len(batch_sizes) == 1:  # a table needs two rows; an engine of batch 1 never runs 2
        batch_sizes.append(batch_sizes[0] + 1)
        rows.append(list(rows[0]))
    return CostTable(
        batch_sizes=tuple(batch_sizes),
        tokens_per_request=tuple(widths),
        step_time_s=tuple(tuple(row) for row in rows),
        shape="embedded engine steps",
        device=str(engine.runner.device),
        source="start-up profile",
        includes_draft=True,
    )


def bucket_points(engine: Engine, min_batch: int = BUCKET_MIN_BATCH) -> dict[int, list[int]]:
    """The captured token counts a GPU's ragged engine runs two-phase steps at, per batch
    size from ``min_batch`` (``RaggedShapes``, the whole block's width; counts below the
    batch left out): none on an engine without ragged CUDA graphs."""
    runner = engine.runner
    shapes = getattr(runner, "ragged_shapes", None)
    if runner.verify_mode != "ragged" or not runner.use_cuda_graphs or shapes is None:
        return {}
    widest = max((w for _, w in shapes.buckets), default=0)
    return {
        batch: [n for n in counts if n >= batch]
        for (batch, width), counts in sorted(shapes.buckets.items())
        if width == widest and batch >= min_batch and any(n >= batch for n in counts)
    }


def profile_token_buckets(
    engine: Engine,
    points: Mapping[int, Sequence[int]],
    timed_steps: int = TIMED_STEPS,
    on_point: Callable[[int, int, float], None] | None = None,
) -> tuple[tuple[int, tuple[tuple[int, float], ...]], ...]:
    """Median wall time of ``timed_steps`` engine steps of B rows verifying N tokens in all
    (rows at k = N // B - 1, the first N % B of them one more), for every (B, N) of
    ``points`` (``bucket_points``): ``CostTable.token_buckets``. The engine must be idle."""
    vocab = engine.runner.target.shape.vocab_size
    rng = random.Random(1)
    out = []
    with _profiling(engine):
        for batch in sorted(points):
            measured = []
            for tokens in sorted(points[batch]):
                base, extra = divmod(tokens, batch)
                ks = [base - 1 + (i < extra) for i in range(batch)]
                seconds = _time_rows(engine, ks, timed_steps, vocab, rng)
                measured.append((tokens, seconds))
                if on_point is not None:
                    on_point(batch, tokens, seconds)
            out.append((batch, tuple(measured)))
    return tuple(out)


@contextmanager
def _profiling(engine: Engine) -> Iterator[None]:
    """An idle engine set for timing fixed points, given back as it was after: no planner
    (each point's k is fixed, not the policy's), whole-block drafts (every width priced at
    what it computes) and one drafting step a call (``_step``)."""
    if engine.has_work:
        raise RuntimeError("profile an idle engine: requests are running")
    planner, engine.planner = engine.planner, None
    narrow, engine.runner.narrow_drafts = engine.runner.narrow_drafts, False
    bursts, engine.spec_burst = engine.spec_burst, 1
    try:
        yield
    finally:
        engine.planner = planner
        engine.runner.narrow_drafts = narrow
        engine.spec_burst = bursts


def _time_point(
    engine: Engine, batch: int, k: int, timed_steps: int, vocab: int, rng: random.Random
) -> float:
    return _time_rows(engine, [k] * batch, timed_steps, vocab, rng)


def _time_rows(
    engine: Engine, ks: Sequence[int], timed_steps: int, vocab: int, rng: random.Random
) -> float:
    """Median seconds of ``timed_steps`` engine steps of ``len(ks)`` rows, row i at ks[i]."""
    block, batch = engine.block_size, len(ks)

    def fixed_k(k: int) -> Callable[[RequestView], int]:
        return lambda view: k

    requests = [
        Request(
            f"profile-{batch}-{sum(ks)}-{i}",
            [rng.randrange(vocab) for _ in range(PROMPT_TOKENS)],
            # Long enough that k is never clamped near the end during the timed steps.
            SamplingParams(max_new_tokens=(timed_steps + 2) * block + 2),
            fixed_k(k),
            {"task": "chat"},
        )
        for i, k in enumerate(ks)
    ]
    for request in requests:
        engine.add(request)
    try:
        _step(engine)  # admits and prefills every row, then the first decode: not timed
        samples = []
        for _ in range(timed_steps):
            started = time.perf_counter()
            steps = _step(engine)
            samples.append((time.perf_counter() - started) / steps)
        if len(engine.scheduler.running) != batch:
            raise RuntimeError(
                f"profile point {batch} rows, {sum(ks) + batch} tokens: a row left early"
            )
        return statistics.median(samples)
    finally:
        for request in requests:
            engine.abort(request.request_id)


def _step(engine: Engine) -> int:
    """One ``engine.step()``; how many decode steps it ran (a plain burst runs several:
    ``Engine.plain_burst``, so a k = 0 point is priced per step, as the policy decides).
    Drafting points are timed one step a call (the profile sets ``spec_burst`` to 1 while it
    runs, as every profile before drafting bursts did): a two-phase step allocated on the host
    never bursts, and a timed request sized for one step a call would end inside a burst."""
    steps: dict[str, int] = {}
    for request, event in engine.step():
        if not isinstance(event, TokenEvent):
            raise RuntimeError(f"profile request {request.request_id} failed: {event}")
        if event.report is not None:
            steps[request.request_id] = steps.get(request.request_id, 0) + 1
    return max(steps.values(), default=1)


def cache_key(
    target_dir: Path,
    draft_dir: Path,
    device: str,
    max_batch_size: int,
    max_seq_len: int,
    kernels: Mapping[str, object],
) -> str:
    """What the measured costs depend on: the model files (configs by content, weights by size
    and modification time), the device, torch, the engine's limits, the method and the
    runner's kernels (``ModelRunner.kernel_settings``: attention, verify mode, compile)."""
    digest = hashlib.sha256()
    parts: list[Any] = [PROFILE_VERSION, device, torch.__version__, max_batch_size, max_seq_len]
    parts.append(sorted((str(name), str(value)) for name, value in kernels.items()))
    if device.startswith("cuda") and torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name(torch.device(device)))
    digest.update(json.dumps(parts).encode())
    for folder in (target_dir, draft_dir):
        for path in sorted(folder.iterdir()):
            if path.name == "config.json":
                digest.update(path.read_bytes())
            elif path.suffix in (".safetensors", ".bin", ".pt"):
                status = path.stat()
                digest.update(f"{path.name}:{status.st_size}:{status.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


def cached_or_profiled(
    engine: Engine,
    key: str,
    cache_dir: Path | None,
    max_batch_size: int,
    describe: dict[str, Any],
) -> tuple[CostTable, str]:
    """The engine's cost table from ``cache_dir`` when one was measured for ``key``, else
    profiled now (and written there; a cache that cannot be written is only logged). Returns
    the table and where it came from."""
    path = None if cache_dir is None else cache_dir / f"steps-{key}.json"
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
            return CostTable.from_dict(data["table"], source=str(path)), f"cached {path}"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the unreadable cost profile %s (%s); measuring again", path, exc)
    started = time.perf_counter()
    table = profile_engine(
        engine,
        max_batch_size,
        on_point=lambda b, w, s: log.info(
            "cost profile: batch %d, width %d: %.2f ms per step", b, w, 1e3 * s
        ),
        on_bucket=lambda b, n, s: log.info(
            "cost profile: batch %d, %d tokens: %.2f ms per step", b, n, 1e3 * s
        ),
    )
    took_s = time.perf_counter() - started
    if path is not None:
        document = {
            **describe,
            "key": key,
            "profiled_s": round(took_s, 2),
            "table": table.to_dict(),
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(document, indent=1) + "\n")
            tmp.replace(path)
        except OSError as exc:
            log.warning("cannot cache the cost profile in %s: %s", cache_dir, exc)
    return table, f"profiled in {took_s:.1f} s"
