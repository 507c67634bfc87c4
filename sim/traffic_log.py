"""Traffic described from a daemon's recorded trace, for ``draftctl plan --traffic-log``.

The served trace (controller/recording.py; ``recording.enabled``) holds one line per finished
request: arrival time, task, prompt and output tokens and, when the request drafted, its
steps' k and accept lengths. From it this module writes a scenario (sim/scenario.py) that
the fleet planner simulates like any described traffic:

- **phases**: the trace's span cut into windows of ``window_s`` seconds (a tail shorter than
  half a window joins the one before), each an *open-loop* phase whose arrival rate is the
  window's requests per second (times ``rate_scale``, to plan for growth) and whose task mix
  is the window's; every request counts, whichever backend served it and whether it drafted
  or not. The planner then ranks layouts by mean request latency (sim/fleet_plan.py). Or
  closed-loop (``loop``: "closed"; "auto" when requests arrive right after others end well
  beyond chance, ``CLOSED_EXCESS``: clients sending their next request): each window as many
  clients as requests were in flight on average there (times ``rate_scale``; at least one),
  ranked by goodput.
- **requests**: the recorded requests that drafted, each with its prompt and output length
  and the hard-token acceptance model the what-if replay uses (sim/replay.py): a step that
  accepted fewer drafts than its k marks its correction token as one the drafter gets wrong;
  a step that accepted all k says nothing past k, so those tokens count as draftable
  (optimistic for wider k than recorded; the summary gives that share per task). The
  simulator draws each arrival's request from its task's recorded ones. Requests that never
  drafted carry no acceptance and are left out of these draws (their arrivals still count).
- **engine and costs**: the block size and batch limit of the backend that served most
  requests (its header line), and a cost table: the one given, else that header's (the
  embedded engine's start-up profile).

Nothing here reads prompt text (the trace holds none). Pure: files in, files out.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from policies.types import TASKS, Task
from sim.replay import CHAIN_GAP_S, TraceError, acceptance, read_lines, served_files

SCENARIO_FILE = "traffic.yaml"
ACCEPTANCE_FILE = "traffic-acceptance.jsonl"
COST_FILE = "traffic-cost.json"
MIN_WINDOW_S = 1.0  # the last window is never shorter (a trace of one request spans 0 s)
MAX_WINDOWS = 1000  # phases a plan simulates (a day in windows of ~90 s)


@dataclass(frozen=True)
class Window:
    name: str
    duration_s: float
    num_requests: int
    mix: dict[Task, float]  # shares of the window's requests (the whole trace's if empty)
    in_flight: float = 0.0  # requests in flight on average over the window (closed loop)


@dataclass(frozen=True)
class Drafted:
    """One recorded request that drafted, in ``traffic-acceptance.jsonl``'s form."""

    task: Task
    prompt_tokens: int
    output_tokens: int
    hard_positions: tuple[int, ...]


@dataclass(frozen=True)
class LoggedTraffic:
    files: list[str]
    backend: str
    block_size: int
    max_batch_size: int
    cost_table: dict[str, Any] | None  # the main backend's header table, if it has one
    windows: list[Window]
    requests: list[Drafted]
    rate_scale: float
    summary: dict[str, Any]
    closed: bool = False  # phases of clients (closed loop) instead of arrival rates


Loop = Literal["auto", "open", "closed"]
# ``loop="auto"``: closed when the requests that arrived within ``CHAIN_GAP_S`` of another
# request's end (a client sending its next one: a benchmark, an agent; the what-if replay's
# chain rule) exceed what independent arrivals would give by chance by at least this much of
# the rest: (chained - chance) / (1 - chance) >= CLOSED_EXCESS, chance = 1 - exp(-ends a second
# x the gap). Where chance passes ``MAX_CHANCE`` (busy traffic: some request always ends just
# before an arrival) timing cannot tell, and the traffic is taken as open (``--loop closed``
# overrides).
CLOSED_EXCESS = 0.5
MAX_CHANCE = 0.8


def read_traffic(
    path: Path,
    window_s: float,
    last_s: float | None = None,
    rate_scale: float = 1.0,
    loop: Loop = "open",
) -> LoggedTraffic:
    """The traffic of the served trace at ``path`` (a file with its rotated ones, or a folder),
    the newest ``last_s`` seconds of it, as open-loop arrival rates or (``loop``: "closed", or
    "auto" and mostly chained requests) closed-loop clients; raises TraceError naming what is
    wrong."""
    if not window_s > 0 or not rate_scale > 0 or (last_s is not None and not last_s > 0):
        raise TraceError("window, rate scale and --last must be > 0")
    files = served_files(path)
    headers, lines = read_lines(files)
    lines = [line for line in lines if not line.get("error")]
    if not lines:
        raise TraceError(f"{path}: the trace holds no served request yet")
    for line in lines:
        _check(path, line)
    if last_s is not None:
        newest = max(float(line["t"]) for line in lines)
        lines = [line for line in lines if float(line["t"]) >= newest - last_s]
    backend = Counter(str(line["backend"]) for line in lines).most_common(1)[0][0]
    header = headers.get(backend)
    if header is None:
        raise TraceError(f"{path}: no engine header line for backend {backend!r}")
    block_size = int(header["block_size"])
    same_block = {name for name, h in headers.items() if int(h["block_size"]) == block_size}
    windows = _windows(lines, window_s)
    chained, chance = _chained_share(lines)
    if loop != "auto":
        closed, basis = loop == "closed", f"--loop {loop}"
    elif chance > MAX_CHANCE:
        closed, basis = False, "auto: too busy to tell clients from arrivals, taken as open"
    else:
        closed = (chained - chance) / (1.0 - chance) >= CLOSED_EXCESS
        basis = f"auto: chained requests {'well ' if closed else 'not '}above chance"
    requests = [
        _drafted(line, block_size)
        for line in lines
        if str(line["backend"]) in same_block and _did_draft(line)
    ]
    return LoggedTraffic(
        files=[str(f) for f in files],
        backend=backend,
        block_size=block_size,
        max_batch_size=int(header.get("max_batch_size") or 128),
        cost_table=header.get("cost_table"),
        windows=windows,
        requests=requests,
        rate_scale=rate_scale,
        summary={
            **_summary(lines, windows, requests, block_size, same_block),
            "loop": "closed" if closed else "open",
            "loop_basis": basis,
            "chained_share": round(chained, 3),
            "chained_by_chance": round(chance, 3),
        },
        closed=closed,
    )


def _chained_share(lines: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(share of requests that arrived within ``CHAIN_GAP_S`` after some request's end, the
    share independent arrivals would give at the trace's rate of ends)."""
    ends = sorted(float(line["t"]) + float(line.get("latency_ms") or 0) / 1e3 for line in lines)
    chained = 0
    for line in lines:
        t = float(line["t"])  # an end in [t - gap, t): another request's, before this arrival
        if bisect.bisect_left(ends, t) > bisect.bisect_left(ends, t - CHAIN_GAP_S):
            chained += 1
    span = max(ends) - min(float(line["t"]) for line in lines)
    rate = len(lines) / span if span > 0 else math.inf
    return chained / len(lines), 1.0 - math.exp(-rate * CHAIN_GAP_S)


def _check(path: Path, line: dict[str, Any]) -> None:
    where = f"{path}: the request recorded at t={line.get('t')!r}"
    try:
        float(line["t"])
        Task(str(line["task"]))
        if int(line["output_tokens"]) < 1 or int(line.get("prompt_tokens") or 0) < 0:
            raise ValueError("token counts out of range")
        str(line["backend"])
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"{where} is not a served-request line ({exc})") from exc


def _did_draft(line: dict[str, Any]) -> bool:
    return bool(line.get("accept_lengths")) or bool(line.get("num_drafts"))


def _drafted(line: dict[str, Any], block_size: int) -> Drafted:
    trace = acceptance(line, block_size)
    return Drafted(
        task=Task(str(line["task"])),
        prompt_tokens=int(line.get("prompt_tokens") or 0),
        output_tokens=trace.num_output_tokens,
        hard_positions=trace.hard_positions,
    )


def _windows(lines: Sequence[dict[str, Any]], window_s: float) -> list[Window]:
    """The trace's windows: one pass over the requests (a day of traffic has millions)."""
    times = [float(line["t"]) for line in lines]
    start, span = min(times), max(times) - min(times)
    count = max(1, math.ceil(span / window_s))
    if count > MAX_WINDOWS:
        raise TraceError(
            f"the trace spans {span:.0f} s: windows of {window_s:g} s make {count} phases (at "
            f"most {MAX_WINDOWS}); use a longer --window-s or keep the --last seconds"
        )
    if count > 1 and span - (count - 1) * window_s < window_s / 2:
        count -= 1  # a short tail joins the window before it (its rate would be noise)
    durations = [window_s] * (count - 1) + [max(MIN_WINDOW_S, span - (count - 1) * window_s)]
    ends = [start + window_s * i + d for i, d in enumerate(durations)]
    tasks: list[list[Task]] = [[] for _ in range(count)]
    busy = [0.0] * count  # request-seconds in flight inside each window
    for line, t in zip(lines, times, strict=True):
        # the last window holds the newest request, also when it ends the span exactly
        first = min(count - 1, int((t - start) // window_s))
        tasks[first].append(Task(str(line["task"])))
        finish = t + float(line.get("latency_ms") or 0) / 1e3
        i = first
        while i < count:
            lo = start + i * window_s
            busy[i] += max(0.0, min(finish, ends[i]) - max(t, lo))
            if finish <= ends[i]:
                break
            i += 1
    overall = _mix([task for window in tasks for task in window])
    return [
        Window(
            f"w{i + 1}", durations[i], len(tasks[i]), _mix(tasks[i]) or overall, b / durations[i]
        )
        for i, b in enumerate(busy)
    ]


def _mix(tasks: Sequence[Task]) -> dict[Task, float]:
    counts = Counter(tasks)
    return {t: counts[t] / len(tasks) for t in TASKS if counts[t]}


def _summary(
    lines: Sequence[dict[str, Any]],
    windows: Sequence[Window],
    requests: Sequence[Drafted],
    block_size: int,
    same_block: set[str],
) -> dict[str, Any]:
    """What the plan rests on, per task: requests, how many drafted (acceptance known), their
    mean recorded k, and the share of drafting steps that accepted every draft (nothing known
    past their k: the hard-token model counts those tokens as draftable)."""
    per_task: dict[str, Any] = {}
    for task in TASKS:
        mine = [line for line in lines if line["task"] == task.value]
        drafted = [line for line in mine if str(line["backend"]) in same_block and _did_draft(line)]
        ks = [k for line in drafted for k in line.get("step_spec_tokens") or []]
        full = sum(
            1
            for line in drafted
            for length, k in zip(
                line.get("accept_lengths") or [], line.get("step_spec_tokens") or [], strict=False
            )
            if length >= k + 1
        )
        per_task[task.value] = {
            "requests": len(mine),
            "drafted_requests": len(drafted),
            "detailed_steps": len(ks),
            "mean_recorded_k": round(sum(ks) / len(ks), 2) if ks else None,
            "max_recorded_k": max(ks) if ks else None,
            "all_accepted_step_share": round(full / len(ks), 3) if ks else None,
        }
    times = [float(line["t"]) for line in lines]
    return {
        "requests": len(lines),
        "span_s": round(max(times) - min(times), 3),
        "windows": len(windows),
        "block_size": block_size,
        "drafted_requests": len(requests),
        "tasks": per_task,
    }


def write_traffic(
    traffic: LoggedTraffic,
    out_dir: Path,
    cost_table: Path | None = None,
    instances: int | None = None,
    draft_cost_fraction: float = 0.16,
    max_batch_size: int | None = None,
) -> Path:
    """Write ``traffic.yaml`` (the scenario; ``max_batch_size`` default: the trace header's),
    ``traffic-acceptance.jsonl`` (the drafted requests) and, when the table comes from the
    trace's header, ``traffic-cost.json`` into ``out_dir``; returns the scenario's path.
    Raises TraceError if there is no cost table or a task of the traffic has no drafted
    request to draw from."""
    missing = sorted(
        {t.value for w in traffic.windows if w.num_requests for t in w.mix}
        - {r.task.value for r in traffic.requests}
    )
    if missing:
        raise TraceError(
            f"no recorded request of task(s) {', '.join(missing)} drafted, so their acceptance "
            "is unknown: record traffic with drafting on for them (a pool at k > 0; a vLLM "
            "pool needs --per-request-spec-decode-metrics), or describe the traffic in a "
            "scenario file with acceptance traces (--traffic)"
        )
    if cost_table is not None and not cost_table.is_file():
        raise TraceError(f"--cost-table {cost_table}: no such file")
    out_dir.mkdir(parents=True, exist_ok=True)
    if cost_table is None:
        if traffic.cost_table is None:
            raise TraceError(
                f"backend {traffic.backend!r}'s header has no cost table: pass --cost-table "
                "(draftctl profile-cost measures one on the servers' GPU)"
            )
        cost_table = out_dir / COST_FILE
        cost_table.write_text(json.dumps(traffic.cost_table, indent=1) + "\n")
    with (out_dir / ACCEPTANCE_FILE).open("w") as f:
        for r in traffic.requests:
            line = {
                "task": r.task.value,
                "block_size": traffic.block_size,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "hard_positions": list(r.hard_positions),
            }
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    path = out_dir / SCENARIO_FILE
    # relative to the scenario, as scenario paths resolve: the folder can move with its table
    table = Path(os.path.relpath(cost_table.resolve(), out_dir.resolve()))
    batch = max_batch_size or traffic.max_batch_size
    path.write_text(_scenario_text(traffic, table, instances, draft_cost_fraction, batch))
    return path


def _scenario_text(
    traffic: LoggedTraffic,
    cost_table: Path,
    instances: int | None,
    draft_cost_fraction: float,
    max_batch_size: int,
) -> str:
    s = traffic.summary
    lines = [
        "# Written by draftctl plan --traffic-log from the served trace:",
        *(f"#   {f}" for f in traffic.files),
        f"# {s['requests']} requests over {s['span_s']} s; {s['drafted_requests']} drafted "
        f"(backend {traffic.backend!r}, block {traffic.block_size}) give the acceptance.",
        (
            "# Phases: closed-loop windows of the recorded requests in flight (clients)"
            if traffic.closed
            else "# Phases: open-loop windows of the recorded arrival rate"
        )
        + (f" x {traffic.rate_scale}" if traffic.rate_scale != 1 else "")
        + " and task mix. Edit and re-plan with --traffic.",
        "name: traffic-log",
        f'description: "recorded traffic: {s["requests"]} requests, {len(traffic.windows)} '
        f'{"closed" if traffic.closed else "open"}-loop windows (draftctl plan --traffic-log)"',
        "seed: 0",
        f"block_size: {traffic.block_size}",
        f"max_batch_size: {max_batch_size}",
        "cost:",
        f"  table: {json.dumps(str(cost_table))}",
        "  verify_width_multiple: 1     # vLLM verifies k + 1 tokens a row, graphs on total tokens",
        f"  draft_cost_fraction: {draft_cost_fraction}   # assumed: the draft forward's share",
        "  batch_verify: padded         # one k per step for the batch (fixed k or a schedule)",
        "  prefill_batching: batched",
        "acceptance:",
        f"  traces: {ACCEPTANCE_FILE}",
        "phases:",
    ]
    for w in traffic.windows:
        if traffic.closed:
            clients = max(1, round(w.in_flight * traffic.rate_scale))
            load = f"concurrency: {clients}"
            note = f"{w.num_requests} requests, {w.in_flight:.2f} in flight on average"
        else:
            load = f"arrival_rate: {w.num_requests / w.duration_s * traffic.rate_scale!r}"
            note = f"{w.num_requests} requests"
        mix = ", ".join(f"{t.value}: {v!r}" for t, v in w.mix.items())
        lines.append(
            f"  - {{name: {w.name}, duration_s: {w.duration_s!r}, {load}, mix: {{{mix}}}}}"
            f"  # {note}"
        )
    if instances is not None:
        lines += ["fleet:", f"  instances: {instances}"]
    return "\n".join(lines) + "\n"
