"""What-if: the requests a daemon served (its recorded trace) replayed under another policy.

The trace (controller/recording.py) gives each request's arrival, task, prompt and output
length and, per step, the k it ran and the accept length it got. Replay rebuilds from that:

- acceptance: the *hard token* model of sim/traces.py on the recorded steps. A step that
  accepted fewer than its k drafts marks its correction token as hard; a step that accepted
  all k, and every plain (k = 0) step, says nothing, so those tokens count as draftable
  (optimistic for a policy that drafts wider than the recorded one: it is censored there).
- arrivals: a request that arrived within ``CHAIN_GAP_S`` of another's end is taken to be the
  same client's next request (a closed loop: a chat user, a benchmark client) and arrives
  that long after its predecessor's *simulated* end, so a faster policy also gets its next
  requests sooner. Other requests arrive at their recorded times.
- the engine: one server with the recorded block size and batch limit, steps priced by the
  header's measured cost table (the embedded engine's start-up profile, draft included),
  every row verified at the widest row's width as the embedded engine runs it. Prefill is
  not in the trace: it is priced as the 10th percentile of the recorded TTFTs per request.

Figures (recorded and simulated alike): output tok/s over the makespan (first arrival to last
end), TTFT and TPOT percentiles, mean k and mean accept length.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.recording import trace_files
from engines.cost_tables import goodput_cost_table
from policies.costmodel import CostTable, padded_width
from policies.model import PolicySpec
from policies.registry import build_policy
from policies.types import Task
from sim.choosers import GoodputChooser, KChooser
from sim.replay_server import ReplayChooser, ReplayRequest, ReplayServer
from sim.runner import EngineCost
from sim.scenario import Costs
from sim.traces import AcceptanceTrace

CHAIN_GAP_S = 0.25  # a request this soon after another's end is its client's next one
_PREFILL_QUANTILE = 0.1


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Engine:
    """What the trace's header says about the engine that served it."""

    backend: str
    block_size: int
    max_batch_size: int
    table: CostTable | None


@dataclass(frozen=True)
class Trace:
    engine: Engine
    requests: list[ReplayRequest]
    files: list[str]


def load_trace(path: Path, last_s: float | None = None) -> Trace:
    """The served requests at ``path`` (and its rotated files), the last ``last_s`` seconds."""
    files = served_files(path)
    headers, lines = read_lines(files)
    if not lines:
        raise TraceError(f"{path}: the trace holds no served request yet")
    backend = _main_backend(lines)
    header = headers.get(backend)
    if header is None:
        raise TraceError(f"{path}: no engine header for backend {backend!r}")
    lines = [line for line in lines if line["backend"] == backend and not line["error"]]
    if last_s is not None:
        newest = max(line["t"] for line in lines)
        lines = [line for line in lines if line["t"] >= newest - last_s]
    block_size = int(header["block_size"])
    table = header.get("cost_table")
    engine = Engine(
        backend,
        block_size,
        int(header.get("max_batch_size") or 8),
        None if table is None else CostTable.from_dict(table, source=f"{path} header"),
    )
    return Trace(engine, _requests(lines, block_size), [str(f) for f in files])


def served_files(path: Path) -> list[Path]:
    """The served trace at ``path`` with its rotated files (oldest first), or a folder's."""
    files = trace_files(path) if not path.is_dir() else sorted(path.glob("*.jsonl*"))
    if not files:
        raise TraceError(f"{path}: no trace file there; enable recording in config.yaml")
    return files


def read_lines(files: Iterable[Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The engine headers by backend and the served request lines (with output) of ``files``."""
    headers: dict[str, Any] = {}
    lines: list[dict[str, Any]] = []
    for file in files:
        for number, text in enumerate(file.read_text().splitlines(), start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except ValueError as exc:
                raise TraceError(f"{file}:{number}: not JSON ({exc})") from exc
            if line.get("type") == "engine":
                headers[line["backend"]] = line
            elif line.get("type") == "request" and line.get("output_tokens"):
                lines.append(line)
    return headers, lines


def _main_backend(lines: Sequence[dict[str, Any]]) -> str:
    """The backend that served the most requests: the one engine replay models."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line["backend"]] = counts.get(line["backend"], 0) + 1
    return max(counts, key=lambda name: counts[name])


def _requests(lines: list[dict[str, Any]], block_size: int) -> list[ReplayRequest]:
    lines = sorted(lines, key=lambda line: line["t"])
    start = lines[0]["t"]
    ends = [line["t"] + line["latency_ms"] / 1e3 for line in lines]
    requests = []
    claimed: set[int] = set()
    for i, line in enumerate(lines):
        before = [j for j in range(i) if j not in claimed and 0 <= line["t"] - ends[j]]
        before = [j for j in before if line["t"] - ends[j] <= CHAIN_GAP_S]
        predecessor = max(before, key=lambda j: ends[j]) if before else None
        if predecessor is not None:
            claimed.add(predecessor)
        gap = 0.0 if predecessor is None else line["t"] - ends[predecessor]
        requests.append(
            ReplayRequest(
                index=i,
                task=Task(line["task"]),
                prompt_tokens=int(line.get("prompt_tokens") or 0),
                trace=acceptance(line, block_size),
                arrival_s=line["t"] - start,
                end_s=ends[i] - start,
                ttft_s=None if line.get("ttft_ms") is None else line["ttft_ms"] / 1e3,
                decode_s=None if line.get("decode_ms") is None else line["decode_ms"] / 1e3,
                predecessor=predecessor,
                gap_s=gap,
                recorded_k=_mean_k(line),
                recorded_accept=_mean_accept(line),
                concurrency=int(line.get("concurrency") or 1),
                step_times=_step_times(line),
            )
        )
    return requests


def acceptance(line: dict[str, Any], block_size: int) -> AcceptanceTrace:
    """Hard positions implied by a request's recorded steps (see the module docstring)."""
    num_output = int(line["output_tokens"])
    lengths = line.get("accept_lengths") or []
    ks = line.get("step_spec_tokens") or []
    if not lengths and line.get("num_drafts"):
        lengths, ks = _summary_steps(line, num_output, block_size)
    hard: list[int] = []
    position = 1  # the prefill emitted the first token
    for length, k in zip(lengths, ks, strict=False):
        if length < k + 1:
            hard.append(position + length - 1)
        position += length
    return AcceptanceTrace(num_output, tuple(hard))


def _summary_steps(
    line: dict[str, Any], num_output: int, block_size: int
) -> tuple[list[int], list[int]]:
    """Steps spread evenly for a pool that reported counts only (vLLM ``summary`` level)."""
    k = max(1, int(line["spec_tokens"]))
    mean = 1.0 + int(line["num_accepted_tokens"] or 0) / int(line["num_drafts"])
    length = max(1, min(k + 1, round(mean)))
    steps = max(1, (num_output - 1) // length)
    return [length] * steps, [k] * steps


def _step_times(line: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    """(k, seconds) of every recorded step that has a measured time."""
    ks = line.get("step_spec_tokens") or []
    drafted = zip(ks, line.get("step_ms") or [], strict=False)
    plain = ((0, ms) for ms in line.get("plain_step_ms") or [])
    return tuple((int(k), ms / 1e3) for k, ms in [*drafted, *plain])


def _mean_k(line: dict[str, Any]) -> float:
    ks = list(line.get("step_spec_tokens") or []) + [0] * int(line.get("num_plain_steps") or 0)
    return statistics.fmean(ks) if ks else float(line["spec_tokens"])


def _mean_accept(line: dict[str, Any]) -> float | None:
    lengths = line.get("accept_lengths") or []
    return statistics.fmean(lengths) if lengths else None


def prefill_s(requests: Sequence[ReplayRequest]) -> float:
    """Per-request prefill time: a low quantile of the recorded TTFTs (queueing excluded)."""
    ttfts = sorted(r.ttft_s for r in requests if r.ttft_s is not None)
    return ttfts[int(_PREFILL_QUANTILE * (len(ttfts) - 1))] if ttfts else 0.0


def figures(rows: Sequence[tuple[float, float, float | None, float | None, int]]) -> dict[str, Any]:
    """(arrival, end, ttft, tpot, output tokens) per request -> the compared figures."""
    start = min(r[0] for r in rows)
    end = max(r[1] for r in rows)
    tokens = sum(r[4] for r in rows)
    ttfts = [r[2] for r in rows if r[2] is not None]
    tpots = [r[3] for r in rows if r[3] is not None]
    return {
        "requests": len(rows),
        "output_tokens": tokens,
        "makespan_s": round(end - start, 3),
        "output_tok_s": tokens / max(1e-9, end - start),
        "ttft_ms": {"p50": _pct_ms(ttfts, 0.5), "p99": _pct_ms(ttfts, 0.99)},
        "tpot_ms": {"p50": _pct_ms(tpots, 0.5), "p99": _pct_ms(tpots, 0.99)},
    }


def _pct_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def recorded_figures(trace: Trace) -> dict[str, Any]:
    rows = [
        (r.arrival_s, r.end_s, r.ttft_s, r.recorded_tpot_s, r.trace.num_output_tokens)
        for r in trace.requests
    ]
    out = figures(rows)
    out["mean_spec_tokens"] = statistics.fmean(r.recorded_k for r in trace.requests)
    accepts = [r.recorded_accept for r in trace.requests if r.recorded_accept is not None]
    out["mean_accept_length"] = statistics.fmean(accepts) if accepts else None
    return out


def chooser_for(spec: PolicySpec, table: CostTable, block_size: int, seed: int) -> KChooser:
    """The k chooser that runs ``spec`` the way the embedded engine runs it."""
    lo, _ = spec.bounds_for(block_size)
    if spec.kind == "goodput":
        return GoodputChooser(spec.goodput, table, block_size, seed, lo, padded=True)
    return ReplayChooser(spec, build_policy(spec), block_size, seed)


@dataclass
class ScaledCost(EngineCost):
    """The engine's true step cost: the profile's times times ``scale`` (see
    ``step_time_scale``); the policy still prices k with the unscaled profile, as it does in
    the daemon."""

    scale: float = 1.0

    def base_step_time_s(self, batch_size: float, mean_width: float, drafting: float) -> float:
        return self.scale * super().base_step_time_s(batch_size, mean_width, drafting)


def step_time_scale(trace: Trace, cost: EngineCost) -> float:
    """Measured step time over the profile's, summed over the recorded steps.

    A step's batch size is not recorded: the request's concurrency when it started stands in
    for it (capped at the batch limit); its width is the k it ran, padded.
    """
    measured = predicted = 0.0
    for request in trace.requests:
        batch = max(1, min(trace.engine.max_batch_size, request.concurrency))
        for k, step_s in request.step_times:
            width = float(padded_width(k, cost.verify_width_multiple)) if k else 1.0
            predicted += cost.base_step_time_s(batch, width, 1.0 if k else 0.0)
            measured += step_s
    return measured / predicted if predicted > 0 and measured > 0 else 1.0


def simulate(
    trace: Trace,
    spec: PolicySpec,
    policy_dir: Path = Path("."),
    seed: int = 0,
    calibrate: bool = True,
) -> dict[str, Any]:
    """The trace's requests under ``spec`` on the simulated engine; returns its figures."""
    table = goodput_cost_table(spec.goodput, policy_dir) if spec.kind == "goodput" else None
    table = table or trace.engine.table
    if table is None:
        raise TraceError(
            f"the trace has no step-cost table for backend {trace.engine.backend!r} (only the "
            "embedded engine measures one); give the policy a goodput cost_table"
        )
    multiple = spec.goodput.verify_width_multiple
    costs = Costs(
        verify_width_multiple=multiple,
        draft_cost_fraction=0.0,  # the engine's profile times whole steps, draft included
        batch_verify="padded",
        prefill_base_s=prefill_s(trace.requests),
        prefill_s_per_token=0.0,
        prefill_batching="per_request",
    )
    block_size = trace.engine.block_size
    cost = EngineCost(table=table, block_size=block_size, verify_width_multiple=multiple)
    scale = step_time_scale(trace, cost) if calibrate else 1.0
    cost = ScaledCost(table=table, block_size=block_size, verify_width_multiple=multiple)
    cost.scale = scale
    chooser = chooser_for(spec, table, block_size, seed)
    server = ReplayServer(trace.requests, chooser, cost, costs, trace.engine.max_batch_size)
    out = figures(server.run())
    out["step_time_scale"] = round(scale, 4)
    out["mean_spec_tokens"] = server.mean_spec_tokens()
    out["mean_accept_length"] = server.mean_accept_length()
    return out


def compare(
    trace: Trace,
    what_if: tuple[str, PolicySpec],
    recorded_policy: tuple[str, PolicySpec] | None,
    policy_dir: Path = Path("."),
    calibrate: bool = True,
) -> dict[str, Any]:
    """Recorded figures, the what-if policy's and (given) the recorded policy's replay.

    ``delta``: what-if against the recorded policy's *replay* when that is given (the
    simulator's bias cancels), else against the recorded figures.
    """
    report: dict[str, Any] = {
        "trace": {"files": trace.files, "backend": trace.engine.backend},
        "recorded": recorded_figures(trace),
        "what_if": {
            "policy": what_if[0],
            **simulate(trace, what_if[1], policy_dir, calibrate=calibrate),
        },
    }
    base = report["recorded"]
    if recorded_policy is not None:
        replayed = simulate(trace, recorded_policy[1], policy_dir, calibrate=calibrate)
        report["recorded_policy_replayed"] = {"policy": recorded_policy[0], **replayed}
        report["reproduction_error"] = replayed["output_tok_s"] / base["output_tok_s"] - 1.0
        base = replayed
    report["delta"] = _delta(report["what_if"], base)
    return report


def _delta(new: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b - 1.0

    return {
        "output_tok_s": ratio(new["output_tok_s"], base["output_tok_s"]),
        "tpot_p50": ratio(new["tpot_ms"]["p50"], base["tpot_ms"]["p50"]),
        "ttft_p50": ratio(new["ttft_ms"]["p50"], base["ttft_ms"]["p50"]),
    }
