"""Ragged vs padded CUDA-graph verify, one device call (issue 16): same tokens, step cost, capture.

    python bench/ragged_gpu_check.py --out $OUT/ragged_gpu_check.json    # H200, 8B shape
    python bench/ragged_gpu_check.py --device cpu --tiny --out /tmp/r.json  # CPU smoke (tests)

Builds the Qwen3-8B-shape target and a block-16 DFlash draft with random bf16 weights (as
bench/engine_gpu.py and bench/decisions/arms.py do), one ``verify_mode="ragged"`` runner (it
holds the padded graphs and the ragged ones; ``runner.verify_mode`` switches between them on the
same caches and weights), random K/V in the caches below ``--context-len``, then:

1. exactness: per batch and k mix, the ragged graph's logits vs the padded graph's on the same
   inputs (max |diff|, argmax agreement, agreement where the padded top-2 margin exceeds
   ``--margin``), and full ``runner.step`` calls (greedy; one-phase and the two-phase
   ``allocate=`` path) emitting the same tokens either way;
2. timing: the ragged verify replay (host index build and its copy included) against the padded
   replay at the widest k and, where the mix's tokens per row is a captured width, the padded
   replay of equal total tokens at the same batch; the same for whole steps (draft included);
3. two-phase steps (the goodput policy's ``step_mode: slots``): whole steps one- and
   two-phase at the same verified k, and the two-phase step's parts on the host clock (to the
   allocation: the draft and the confidence's copy; the allocation; the verify after it);
4. start-up: capture seconds and graph counts, padded and ragged, and GPU memory; where a
   first start's time goes: dynamo's and inductor's own timers (``compile_time_s``) and
   the Triton kernels launched from Python (the engine's attention kernels: ``triton_jit``,
   per kernel its launches, the launches that compiled a specialisation and their seconds);
5. pruning: the engine's start-up timing of every graph (``runner.keep_faster_ragged``; this
   runner is built without it so that sections 1-3 see every bucket): per (B, W) the largest
   token bucket that stays ragged, and each graph's replay in ms.

Writes the JSON after every section (a stopped run keeps what finished); ``--budget-s`` skips
what would not finish in time and says so in the JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.embedded.cuda_graphs import padded_size
from engines.embedded.events import (
    ATTENTIONS,
    COMPILE_SCOPES,
    LINEAR_CHOICES,
    VERIFY_MODES,
    SamplingParams,
    VerifyMode,
)
from engines.embedded.loader import build_models
from engines.embedded.ragged import RaggedShapes
from engines.embedded.request import Request
from engines.embedded.runner import GRAPH_BATCH_SIZES, ModelRunner
from engines.embedded.shapes import TARGET_SHAPES, TINY_SHAPE, dflash_draft_for
from policies.types import PositionValues

logger = logging.getLogger("bench.ragged_gpu_check")
TINY = TINY_SHAPE
BLOCK = 16


def k_mixes(batch: int, seed: int) -> dict[str, list[int]]:
    """Per-row k for a batch. The first three use 8 tokens per row on average (N = 8 B), so the
    padded width-8 graph at the same batch is the step of equal total tokens."""
    rng = random.Random(seed)
    spread = [rng.randint(0, 14) for _ in range(batch)]
    while sum(spread) != 7 * batch:  # random k in 0..14 with mean 7
        i = rng.randrange(batch)
        spread[i] += (sum(spread) < 7 * batch) - (sum(spread) > 7 * batch)
        spread[i] = min(14, max(0, spread[i]))
    mixes = {
        "k0_k14_halves": [0, 14] * (batch // 2) + [7] * (batch % 2),
        "k3_k11_halves": [3, 11] * (batch // 2) + [7] * (batch % 2),
        "random_mean7": spread,
        "k15_quarter_rest_k0": [15 if i % 4 == 0 else 0 for i in range(batch)],
        "uniform_k7": [7] * batch,
        "uniform_k15": [15] * batch,
    }
    return mixes


def sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def timed_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()  # warm (first use of an index buffer, allocator)
    start = sync(device)
    for _ in range(repeats):
        fn()
    return 1e3 * (sync(device) - start) / repeats


def alternating(
    fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, rounds: int
) -> dict[str, float]:
    """Median over rounds of each function's mean time; rounds alternate the functions."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(timed_ms(fn, device, repeats))
    return {name: statistics.median(values) for name, values in samples.items()}


def _dynamo_compiles() -> dict[str, dict[str, int]]:
    """What torch.compile did during start-up, from dynamo's counters: ``stats.unique_graphs``
    (graphs compiled: each a start-up cost of seconds on the H200 8B shape, from a width or
    batch change that recompiles, a size-1 specialisation or a stride guard;
    ``TORCH_LOGS=recompiles`` says which), and inductor's FX-graph cache hits and misses (a
    restart with ``compile_cache_dir`` should only hit)."""
    from torch._dynamo.utils import counters

    return {group: {k: int(v) for k, v in values.items()} for group, values in counters.items()}


def _compiled_count(fn: Any) -> int | None:
    """Specialisations a Triton ``JITFunction`` holds (its per-device kernel caches), or None
    where this Triton keeps them elsewhere."""
    caches = getattr(fn, "device_caches", None)
    if isinstance(caches, dict):
        return sum(len(entry[0]) for entry in caches.values())
    old = getattr(fn, "cache", None)
    if isinstance(old, dict):
        return sum(len(entry) for entry in old.values() if isinstance(entry, dict))
    return None


class JitLaunchTimer:
    """Times every launch of a Triton kernel made from Python (``JITFunction.run``: the
    engine's own attention kernels; inductor's kernels launch through their own launcher and
    are in ``compile_time_s``) while installed, and counts the launches that compiled a new
    specialisation (its kernel cache grew; where the cache cannot be read, a launch over
    ``slow_s``). A compile happens on the host inside the launch, so its seconds are start-up."""

    def __init__(self, slow_s: float = 0.02) -> None:
        self.slow_s = slow_s
        self.kernels: dict[str, dict[str, float]] = {}
        self._original: Any = None

    def install(self) -> bool:
        try:
            from triton.runtime.jit import JITFunction
        except ImportError:
            return False
        original = JITFunction.run
        timer = self

        def run(fn: Any, *args: Any, **kwargs: Any) -> Any:
            before = _compiled_count(fn)
            started = time.perf_counter()
            out = original(fn, *args, **kwargs)
            spent = time.perf_counter() - started
            after = _compiled_count(fn)
            compiled = (
                after > before
                if before is not None and after is not None
                else (spent > timer.slow_s)
            )
            name = getattr(getattr(fn, "fn", None), "__name__", None) or repr(fn)
            entry = timer.kernels.setdefault(
                name, {"launches": 0, "compiles": 0, "compile_s": 0.0, "launch_s": 0.0}
            )
            entry["launches"] += 1
            if compiled:
                entry["compiles"] += 1
                entry["compile_s"] += spent
            else:
                entry["launch_s"] += spent
            return out

        self._original = original
        JITFunction.run = run
        return True

    def uninstall(self) -> None:
        if self._original is not None:
            from triton.runtime.jit import JITFunction

            JITFunction.run = self._original
            self._original = None

    def summary(self) -> dict[str, dict[str, float]]:
        return {
            name: {k: round(v, 3) if isinstance(v, float) else v for k, v in entry.items()}
            for name, entry in sorted(self.kernels.items())
        }


def _compile_time_s() -> dict[str, float]:
    """Seconds per timed stage of torch.compile in this process (dynamo's ``dynamo_timed``
    metrics: tracing, inductor's compile, its async kernel compiles), summed over graphs."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return {}
    return {name: round(sum(values), 3) for name, values in compilation_time_metrics.items()}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.started = time.perf_counter()
        self.result: dict[str, Any] = {"command": " ".join(sys.argv), "skipped": []}
        self.runner = self._build()

    def over_budget(self, what: str) -> bool:
        if time.perf_counter() - self.started < self.args.budget_s:
            return False
        self.result["skipped"].append(what)
        logger.warning("over the %.0f s budget: skipping %s", self.args.budget_s, what)
        return True

    def save(self) -> None:
        self.result["elapsed_s"] = round(time.perf_counter() - self.started, 1)
        Path(self.args.out).write_text(json.dumps(self.result, indent=1) + "\n")

    def _build(self) -> ModelRunner:
        args, device = self.args, self.device
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        shape = TINY if args.tiny else TARGET_SHAPES[args.shape]
        spec = dflash_draft_for(shape, block_size=BLOCK)
        max_batch = max(args.batches)
        max_seq_len = args.context_len + 2 * BLOCK
        torch.manual_seed(args.seed)
        jit = JitLaunchTimer()
        timing_jit = device.type == "cuda" and jit.install()
        started = time.perf_counter()
        target, draft = build_models(shape, spec, device, dtype, max_seq_len + 2 * BLOCK)
        built_s = time.perf_counter() - started
        try:
            runner = ModelRunner(
                target,
                draft,
                device,
                dtype,
                max_batch,
                max_seq_len,
                use_cuda_graphs=True,
                compile_forwards=args.compile,
                compile_scope=args.compile_scope,
                attention=args.attention,
                verify_mode="ragged",
                # every bucket measured here; section 5 prunes as the engine does
                prune_ragged=False,
                compile_attention_ahead=args.compile_ahead,
                linear=args.linear,
                defer_context=args.defer_context,
                **({} if args.graph_warmups is None else {"graph_warmups": args.graph_warmups}),
            )
        finally:
            jit.uninstall()
        for cache in (runner.target_cache, runner.draft_cache):  # a context to attend to
            cache.k.normal_()
            cache.v.normal_()
        batches = [b for b in GRAPH_BATCH_SIZES if b < max_batch] + [max_batch]
        self.result["setup"] = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "shape": "tiny" if args.tiny else args.shape,
            "block_size": BLOCK,
            "dtype": str(dtype),
            "context_len": args.context_len,
            "max_batch_size": max_batch,
            "compiled": args.compile,
            "compile_scope": args.compile_scope,
            "attention": args.attention,
            "build_models_s": round(built_s, 2),
            "capture_s": {k: round(v, 2) for k, v in runner.capture_s.items()},
            "capture_parts_s": {k: round(v, 2) for k, v in runner.capture_parts_s.items()},
            "capture_stages_s": {
                kind: {k: round(v, 2) for k, v in stages.items()}
                for kind, stages in runner.capture_stages_s.items()
            },
            "num_graphs": {"padded": len(runner._graphs), "ragged": len(runner._ragged_graphs)},
            "attention_compiled_ahead": runner.attention_compiled_ahead,
            "graph_warmups": runner.graph_warmups,
            "widths": runner.widths,
            "batch_sizes": batches,
            "ragged_graphs_if_max_batch_128": len(
                RaggedShapes([*GRAPH_BATCH_SIZES], runner.widths).keys
            ),
        }
        if args.compile:
            self.result["setup"]["dynamo"] = _dynamo_compiles()
            self.result["setup"]["compile_time_s"] = _compile_time_s()
        if timing_jit:
            self.result["setup"]["triton_jit"] = jit.summary()
        if device.type == "cuda":
            self.result["setup"]["gpu_memory_gb"] = {
                "allocated": round(torch.cuda.memory_allocated(device) / 1e9, 2),
                "reserved": round(torch.cuda.memory_reserved(device) / 1e9, 2),
            }
        logger.info("set-up: %s", self.result["setup"])
        return runner

    # -- inputs ------------------------------------------------------------------------------

    def verify_inputs(self, spec_tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """ids, positions [rows, W] (W = the captured width of the widest row) and W."""
        rows, width = len(spec_tokens), padded_size(max(spec_tokens) + 1, self.runner.widths)
        gen = torch.Generator().manual_seed(sum(spec_tokens) + rows)
        vocab = self.runner.target.shape.vocab_size
        ids = torch.randint(0, vocab, (rows, width), generator=gen).to(self.device)
        positions = self.args.context_len + torch.arange(width, device=self.device)
        return ids, positions.repeat(rows, 1), width

    def requests(self, batch: int) -> list[Request]:
        """Rows at ``context_len`` (their caches hold the random context), greedy."""
        rows = []
        for slot in range(batch):
            request = Request(
                f"r{slot}",
                [0] * self.args.context_len,
                SamplingParams(max_new_tokens=4 * BLOCK),
                lambda view: 0,
                {},
            )
            request.output_ids = [1 + slot]
            request.slot = slot
            rows.append(request)
        return rows

    # -- 1. exactness --------------------------------------------------------------------------

    @torch.inference_mode()
    def compare_logits(self, spec_tokens: list[int]) -> dict[str, Any]:
        runner = self.runner
        ids, positions, width = self.verify_inputs(spec_tokens)
        rows = len(spec_tokens)
        batch = padded_size(rows, runner.batch_sizes)
        runner.verify_mode = "padded"
        padded = runner._run_verify(ids, positions, spec_tokens, eager=False).float().clone()
        runner.verify_mode = "ragged"
        ragged = runner._run_verify(ids, positions, spec_tokens, eager=False).float()
        valid = (
            torch.arange(width, device=self.device)[None, :]
            <= torch.tensor(spec_tokens, device=self.device)[:, None]
        )
        want, got = padded[valid], ragged[valid]
        top2 = want.topk(2, dim=-1).values
        decided = (top2[:, 0] - top2[:, 1]) > self.args.margin
        agree = want.argmax(-1) == got.argmax(-1)
        lengths = [k + 1 for k in spec_tokens]
        return {
            "num_tokens": sum(lengths),
            "token_bucket": runner.ragged_shapes.choose(lengths, batch, width),
            "padded_tokens": batch * width,
            "max_abs_diff": float((want - got).abs().max()),
            "logit_abs_max": float(want.abs().max()),
            "argmax_agreement": float(agree.float().mean()),
            "num_decided": int(decided.sum()),
            "argmax_agreement_decided": float(agree[decided].float().mean())
            if decided.any()
            else None,
        }

    @torch.inference_mode()
    def compare_steps(self, spec_tokens: list[int]) -> dict[str, Any]:
        """Greedy ``runner.step`` both ways, one-phase and two-phase: the same tokens?"""
        runner, rows = self.runner, self.requests(len(spec_tokens))
        uniforms = torch.rand(len(rows), 2 * BLOCK + 1)

        def halve(confidence: list[list[float]]) -> list[int]:
            return [len(c) // 2 for c in confidence]

        out: dict[str, Any] = {}
        for label, allocate in (("one_phase", None), ("two_phase", halve)):
            tokens = {}
            for mode in VERIFY_MODES:
                runner.verify_mode = mode
                step = runner.step(rows, spec_tokens, uniforms, allocate=allocate)
                tokens[mode] = (step.new_tokens, step.accepted)
            out[label] = {
                "same_tokens": tokens["padded"] == tokens["ragged"],
                "rows_same": sum(
                    a == b for a, b in zip(tokens["padded"][0], tokens["ragged"][0], strict=True)
                ),
                "rows": len(rows),
            }
        runner.verify_mode = "ragged"
        return out

    # -- 2. timing -----------------------------------------------------------------------------

    @torch.inference_mode()
    def time_mix(self, spec_tokens: list[int]) -> dict[str, Any]:
        runner, device = self.runner, self.device
        rows = len(spec_tokens)
        batch = padded_size(rows, runner.batch_sizes)
        ids, positions, width = self.verify_inputs(spec_tokens)
        num_tokens = sum(k + 1 for k in spec_tokens)

        def ragged() -> object:
            runner.verify_mode = "ragged"
            return runner._run_verify(ids, positions, spec_tokens, eager=False)

        def padded_graph(w: int) -> Callable[[], object]:
            graph = runner._graphs["verify", batch, w]
            w_ids, w_pos = ids[:, :w], positions[:, :w]
            if w > width:
                w_ids = torch.cat([ids, ids.new_zeros(rows, w - width)], dim=1)
                w_pos = positions[:, :1] + torch.arange(w, device=device)
            return lambda: graph(w_ids, w_pos)

        fns: dict[str, Callable[[], object]] = {
            "ragged": ragged,
            "padded_widest": padded_graph(width),
        }
        per_row = num_tokens / rows
        for w in runner.widths:
            if w != width:
                fns[f"padded_width_{w}"] = padded_graph(w)
        verify = alternating(fns, device, self.args.repeats, self.args.rounds)
        result: dict[str, Any] = {
            "num_tokens": num_tokens,
            "tokens_per_row": per_row,
            "width": width,
            "token_bucket": runner.ragged_shapes.choose([k + 1 for k in spec_tokens], batch, width),
            "verify_ms": verify,
        }
        equal = f"padded_width_{int(per_row)}" if per_row == int(per_row) else None
        if equal is not None and int(per_row) == width:
            equal = "padded_widest"
        if equal in verify:
            result["verify_ragged_over_equal_tokens"] = verify["ragged"] / verify[equal]
        result["verify_ragged_over_widest"] = verify["ragged"] / verify["padded_widest"]
        result["step_ms"] = self.time_steps(spec_tokens, per_row)
        steps = result["step_ms"]
        result["step_ragged_over_padded"] = steps["ragged"] / steps["padded"]
        if "padded_equal_tokens" in steps:
            result["step_ragged_over_equal_tokens"] = steps["ragged"] / steps["padded_equal_tokens"]
        return result

    def time_steps(self, spec_tokens: list[int], per_row: float) -> dict[str, float]:
        """Whole steps (draft, verify, accept, one sync): ragged and padded at these k, and a
        padded step of uniform k with the same total tokens where one exists."""
        runner, rows = self.runner, self.requests(len(spec_tokens))
        uniforms = torch.rand(len(rows), 2 * BLOCK + 1)

        def step(mode: VerifyMode, ks: list[int]) -> Callable[[], object]:
            def run() -> object:
                runner.verify_mode = mode
                return runner.step(rows, ks, uniforms)

            return run

        fns = {"ragged": step("ragged", spec_tokens), "padded": step("padded", spec_tokens)}
        if per_row == int(per_row) and int(per_row) - 1 != max(spec_tokens):
            fns["padded_equal_tokens"] = step("padded", [int(per_row) - 1] * len(rows))
        times = alternating(fns, self.device, self.args.repeats, self.args.rounds)
        runner.verify_mode = "ragged"
        return times

    # -- 3. two-phase steps -------------------------------------------------------------------

    @torch.inference_mode()
    def two_phase(self, spec_tokens: list[int]) -> dict[str, Any]:
        """Where a two-phase step's time goes, against one-phase steps of the same k: every row
        drafts the block, the allocation (here a fixed answer: no policy's host time) comes
        back, the step verifies it. ``k7``: every row verifies 7 (the padded width-8 graph,
        the same verify as a one-phase k = 7 step: the difference is the two-phase wait);
        ``mix``: these per-row k (a ragged graph). Per variant the median whole-step ms over
        ``rounds x repeats`` steps (variants alternate per round), and for two-phase steps its
        parts on the host clock: start to the allocation's call (draft queued, confidence
        copied: the sync), the allocation, and from its answer to the step's end (verify)."""
        runner, rows = self.runner, self.requests(len(spec_tokens))
        batch = len(rows)
        uniforms = torch.rand(batch, 2 * BLOCK + 1)
        drafted = [BLOCK - 1] * batch
        variants: dict[str, tuple[VerifyMode, list[int], list[int] | None]] = {
            "one_phase_k7": ("padded", [7] * batch, None),
            "two_phase_k7": ("ragged", drafted, [7] * batch),
            "one_phase_mix": ("ragged", spec_tokens, None),
            "two_phase_mix": ("ragged", drafted, spec_tokens),
        }
        step_ms: dict[str, list[float]] = {name: [] for name in variants}
        parts: dict[str, dict[str, list[float]]] = {
            name: {"to_allocation_ms": [], "allocation_ms": [], "after_allocation_ms": []}
            for name, (_, _, verified) in variants.items()
            if verified is not None
        }
        for round_index in range(self.args.rounds + 1):  # round 0 warms each variant
            for name, (mode, ks, verified) in variants.items():
                runner.verify_mode = mode
                for _ in range(self.args.repeats):
                    marks: list[float] = []

                    def allocate(
                        confidence: list[PositionValues],
                        verified: list[int] | None = verified,
                        marks: list[float] = marks,
                    ) -> list[int]:
                        marks.append(time.perf_counter())
                        answer = list(verified or [])
                        marks.append(time.perf_counter())
                        return answer

                    start = sync(self.device)
                    runner.step(rows, ks, uniforms, allocate=allocate if verified else None)
                    end = sync(self.device)
                    if round_index == 0:
                        continue
                    step_ms[name].append(1e3 * (end - start))
                    if verified is not None:
                        part = parts[name]
                        part["to_allocation_ms"].append(1e3 * (marks[0] - start))
                        part["allocation_ms"].append(1e3 * (marks[1] - marks[0]))
                        part["after_allocation_ms"].append(1e3 * (end - marks[1]))
        runner.verify_mode = "ragged"
        medians = {name: statistics.median(v) for name, v in step_ms.items()}
        return {
            "num_tokens_mix": sum(k + 1 for k in spec_tokens),
            "step_ms": medians,
            "two_phase_parts_ms": {
                name: {key: statistics.median(v) for key, v in part.items()}
                for name, part in parts.items()
            },
            "two_phase_over_one_phase_k7": medians["two_phase_k7"] / medians["one_phase_k7"],
            "two_phase_over_one_phase_mix": medians["two_phase_mix"] / medians["one_phase_mix"],
            "one_phase_mix_over_k7": medians["one_phase_mix"] / medians["one_phase_k7"],
        }

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> None:
        self.save()
        exact: dict[str, Any] = {}
        self.result["exactness"] = exact
        for batch in self.args.batches:
            for name, ks in k_mixes(batch, self.args.seed).items():
                if self.over_budget(f"exactness b{batch} {name}"):
                    continue
                exact[f"b{batch}/{name}"] = {
                    "logits": self.compare_logits(ks),
                    "steps": self.compare_steps(ks),
                }
                logger.info("exactness b%d %s: %s", batch, name, exact[f"b{batch}/{name}"])
        self.result["exactness_summary"] = summarise_exactness(exact)
        self.save()
        timing: dict[str, Any] = {}
        self.result["timing"] = timing
        for batch in self.args.batches:
            for name, ks in k_mixes(batch, self.args.seed).items():
                if name.startswith("uniform") or self.over_budget(f"timing b{batch} {name}"):
                    continue
                timing[f"b{batch}/{name}"] = self.time_mix(ks)
                logger.info("timing b%d %s: %s", batch, name, timing[f"b{batch}/{name}"])
                self.save()
        two_phase: dict[str, Any] = {}
        self.result["two_phase"] = two_phase
        for batch in self.args.batches:
            if batch > 1 and not self.over_budget(f"two-phase b{batch}"):
                ks = k_mixes(batch, self.args.seed)["random_mean7"]
                two_phase[f"b{batch}/random_mean7"] = self.two_phase(ks)
                logger.info("two-phase b%d: %s", batch, two_phase[f"b{batch}/random_mean7"])
                self.save()
        if not self.over_budget("pruning"):
            self.result["pruning"] = self.pruning()
        self.save()

    def pruning(self) -> dict[str, Any]:
        """The engine's start-up pruning on this device (``keep_faster_ragged``), with every
        graph timed: per (B, W) the largest token bucket kept ragged, and whether the binary
        search the engine runs (``keep_faster_search``, a fraction of the graphs timed) keeps
        the same buckets on these times."""
        runner = self.runner
        before = dict(runner.ragged_shapes.buckets)
        started = time.perf_counter()
        dropped = runner.keep_faster_ragged(search=False)  # every graph timed
        times = {
            tuple(int(x) for x in key.split("x")): ms
            for key, ms in runner.graph_ms["ragged"].items()
        }
        padded = {
            tuple(int(x) for x in key.split("x")): ms
            for key, ms in runner.graph_ms["padded"].items()
        }
        search = RaggedShapes(runner.ragged_shapes.batch_sizes, runner.ragged_shapes.widths)
        search.buckets = {key: list(sizes) for key, sizes in before.items()}
        search_dropped, search_timed = search.keep_faster_search(
            lambda key: times[key],
            padded,  # type: ignore[index,arg-type]
        )
        kept = {
            f"{b}x{w}": {
                "padded_tokens": b * w,
                "largest_kept": max(runner.ragged_shapes.buckets.get((b, w), [0])),
                "buckets": len(sizes),
            }
            for (b, w), sizes in before.items()
        }
        logger.info(
            "pruning: %d of %d ragged graphs dropped", len(dropped), sum(map(len, before.values()))
        )
        return {
            "seconds": time.perf_counter() - started,
            "dropped": len(dropped),
            "kept": len(runner._ragged_graphs),
            "by_shape": kept,
            "graph_ms": runner.graph_ms,
            "search": {
                "timed": len(search_timed),
                "of": len(times),
                "same_buckets": sorted(search_dropped) == sorted(dropped),
            },
        }


def summarise_exactness(exact: dict[str, Any]) -> dict[str, Any]:
    logits = [v["logits"] for v in exact.values()]
    steps = [v["steps"][p] for v in exact.values() for p in ("one_phase", "two_phase")]
    decided = [x["argmax_agreement_decided"] for x in logits if x["argmax_agreement_decided"]]
    return {
        "max_abs_diff": max((x["max_abs_diff"] for x in logits), default=None),
        "min_argmax_agreement": min((x["argmax_agreement"] for x in logits), default=None),
        "min_argmax_agreement_decided": min(decided, default=None),
        "steps_same_tokens": sum(s["same_tokens"] for s in steps),
        "steps_compared": len(steps),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="tiny random shape (CPU smoke)")
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(TARGET_SHAPES))
    parser.add_argument(
        "--batches", default="1,8,64", type=lambda s: [int(x) for x in s.split(",")]
    )
    parser.add_argument("--context-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20, help="replays per timing round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    parser.add_argument("--margin", type=float, default=0.125, help="decided top-2 logit margin")
    parser.add_argument("--compile", action="store_true", help="torch.compile before capture")
    parser.add_argument(
        "--compile-scope",
        choices=COMPILE_SCOPES,
        default="forward",
        help="with --compile: each forward whole, or the layer steps once (regional)",
    )
    parser.add_argument(
        "--attention",
        choices=ATTENTIONS,
        default="sdpa",
        help="the target's attention kernel in steps (triton: the split-KV kernel; CUDA)",
    )
    parser.add_argument("--budget-s", type=float, default=270.0, help="skip work past this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compile-ahead",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the Triton attention's kernels in worker processes before the captures, "
        "or (--no-compile-ahead) at their first launches (the runner's "
        "compile_attention_ahead; default: the runner's, on for CUDA)",
    )
    parser.add_argument(
        "--graph-warmups",
        type=int,
        default=None,
        help="runs of each graph's forward before its capture (the runner's graph_warmups; "
        "at least 1; default: the runner's, 1)",
    )
    parser.add_argument(
        "--linear",
        choices=LINEAR_CHOICES,
        default="auto",
        help="the linear layers' kernel (the runner's linear; auto: fused on CUDA, else aten)",
    )
    parser.add_argument(
        "--defer-context",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="k = 0 steps stash the draft's context (the runner's defer_context; default: the "
        "runner's, on for CUDA)",
    )
    args = parser.parse_args(argv)
    if args.graph_warmups is not None and args.graph_warmups < 1:
        parser.error(f"--graph-warmups {args.graph_warmups}: at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        logger.error("--device cuda: CUDA is not available here (use --device cpu --tiny)")
        return 2
    bench = Bench(args)
    bench.run()
    logger.info("wrote %s", args.out)
    print(json.dumps({k: bench.result[k] for k in ("setup", "exactness_summary")}, indent=1))
    for key, value in bench.result.get("timing", {}).items():
        ratios = {k: round(v, 3) for k, v in value.items() if "_over_" in k}
        print(key, f"N={value['num_tokens']}", ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
