"""When a request that went plain should draft again: the batch planner replayed at batch 1 on
the real pair's recorded math requests.

At one row the goodput policy's batch planner (``policies.batch_width.BatchWidth``) turns a
request's drafting off once its own window says drafting loses, and the window then changes
only through plain entries (``request_plain_entry_steps`` plain steps each) until the
request's drafted steps have left it. How long that takes decides two faults seen on the
H100 (docs/ragged-log.md): too short and requests that really accept little draft again at a
loss every few dozen steps (session 42's call c, R = 1); too long and a request whose hard
opening gave way to easy text stays plain for hundreds of tokens (session 43's call a,
R = 8: two math requests accepted ~1.5 for their first 44 tokens, ~3 after).

This replays the planner, as the engine calls it (one ``decide`` per step, the step's
outcome fed back to the request's history and to ``OnlineModels``), on the math requests
recorded by a GPU-decisions results file (``bench/gpu_decisions.py`` real-pair arm): the
requests' token sequences are what every policy emits (greedy, lossless), and a recorded
static-k run (the widest one in the file) says how many of its drafted tokens the target
accepted from each point where that run started a step. A replayed step at k starting at
token p accepts ``min(k + 1, a(p), left)``, where a(p) = a - j for the recorded step that
started at p - j with accept length a (the rest of its accepted run). Step times: what the
file's goodput runs' cost model priced at one row (``step_times``), linear between its widths
(``CostTable.time_s``); the planner starts from the same table and learns the same prices.
Its math estimate starts from the file's goodput run's (its planner view half-way through the
phase: learnt over every phase's math rows, warm pass included; the math phase's own steps
are a small part of it), weighted as ``PRIOR_STRENGTH`` pseudo-trials.

Reported per results file: the recorded tok/s of its no-spec, static and goodput runs, and
per setting (the shipped goodput settings, and one variant per ``--variant
NAME:KEY=VALUE,...``) the replayed tok/s, its ratio to the replayed static k and no
speculation (per seed too) and the share of steps that drafted.

    .venv/bin/python bench/plain_return_replay.py \\
        bench/results/gpu_decisions/real-pair_2026-12-06s4*.json.gz \\
        --variant R8:request_plain_entry_steps=8 --variant R1:request_plain_entry_steps=1 \\
        --out bench/results/plain_return_replay.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engines.step_controller import held_calls  # noqa: E402
from policies.batch_width import BatchWidth  # noqa: E402
from policies.costmodel import CostTable  # noqa: E402
from policies.model import GoodputSpec, PolicySpec  # noqa: E402
from policies.online import OnlineModels  # noqa: E402
from policies.types import StepRow, Task  # noqa: E402

BLOCK = 16
# The recorded estimate's weight (pseudo-trials per position): its near positions held
# ~2,000 decayed trials on the GPU, its far ones ~20.
PRIOR_STRENGTH = 200.0


@dataclass
class Request:
    """One recorded request: its length and, per token position, how many tokens a step
    starting there emits at most (bonus included)."""

    tokens: int
    potential: list[int]


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return dict(json.load(handle))


def split_requests(timeline: Sequence[Sequence[float]]) -> list[list[Sequence[float]]]:
    """The phase's steps per request: at one row a step with admitted > 0 starts the next."""
    requests: list[list[Sequence[float]]] = []
    for step in timeline:
        if step[2] or not requests:
            requests.append([])
        requests[-1].append(step)
    return requests


def recorded_requests(run: dict[str, Any], phase: str) -> list[Request]:
    """Each request's per-position potential from a static-k run's timeline."""
    out = []
    for steps in split_requests(run["phases"][phase]["timeline"]):
        emitted = [int(step[7]) for step in steps]
        total = sum(emitted)
        potential = [1] * (total + 1)
        position = 0
        for length in emitted:
            for j in range(length):
                potential[position + j] = max(1, length - j)
            position += length
        out.append(Request(total, potential))
    return out


def step_times(runs: Sequence[dict[str, Any]], phase: str) -> dict[int, float]:
    """Batch-1 step seconds by verify width (1 = plain): what the goodput runs' own cost
    model priced half-way through the phase (k = 0, 3, 7, 11, 15), mean over the runs: fitted
    to the measured steps (call time included), so both the planner and the truth here
    price a step alike."""
    views = [r["phases"][phase]["planner_view"]["step_ms"] for r in runs]
    return {int(k) + 1: statistics.fmean(float(view[k]) for view in views) / 1e3 for k in views[0]}


def step_table(times: dict[int, float]) -> CostTable:
    """``times`` (seconds by verify width, batch 1) as a cost table: the planner's start-up
    table, and through ``time_s`` the price of every replayed step."""
    widths = sorted(times)
    return CostTable(
        batch_sizes=(1, 2),  # the table needs two; only batch 1 runs
        tokens_per_request=tuple(widths),
        step_time_s=(tuple(times[w] for w in widths),) * 2,
        includes_draft=True,
    )


def replay(
    requests: Sequence[Request],
    table: CostTable,
    spec: GoodputSpec,
    seed: int,
    burst: int = 1,
    spacing: int = 1,
) -> dict[str, float]:
    """The planner's k per step over the requests, its math estimate starting from
    ``spec``'s prior (the recorded run's). ``burst`` steps an engine call and a decision held
    for ``spacing`` calls (the step controller's cadence; a probe for one; with
    ``ramp_drafting_holds`` a switch to drafting for one, then doubling): as the engine
    spaces decisions at one row on a GPU (CUDA defaults: bursts of 4, cadence 8)."""
    models = OnlineModels(spec, BLOCK, table, verify_width_multiple=1)
    lo, hi = PolicySpec(kind="goodput", goodput=spec).bounds_for(BLOCK)
    rng = random.Random(seed)
    width = BatchWidth(spec, BLOCK, lo, hi, rng.random)
    seconds = tokens = drafted = steps = 0.0
    held_k, serves, left_steps = 0, 1, 0  # the held decision, the calls it serves, steps left
    for row_id, request in enumerate(requests):
        lengths: list[int] = []
        ks: list[int] = []
        position = 0
        left_steps = 0  # a new request: decided afresh
        while position < request.tokens:
            left = request.tokens - position
            ceiling = min(BLOCK, left) - 1
            if left_steps <= 0:
                row = StepRow(row_id, Task.MATH, lengths, ks, ceiling)
                k_new = width.decide([row], models.observe)
                if width.last[0] == "probe":
                    serves = 1
                else:
                    before = (held_k, serves)
                    serves = held_calls(k_new, before, spacing, spec.ramp_drafting_holds)
                held_k, left_steps = k_new, serves * burst
            left_steps -= 1
            k = min(held_k, ceiling)
            length = min(k + 1, request.potential[position], left)
            step_s = table.time_s(1, k + 1)
            lengths.append(length)
            ks.append(k)
            models.record_step(Task.MATH, k, length)
            models.record_step_time(1, float(k + 1), float(k > 0), step_s)
            position += length
            seconds += step_s
            tokens += length
            drafted += k > 0
            steps += 1
    return {
        "seconds": seconds,
        "tok_s": tokens / seconds,
        "steps": steps,
        "drafted_share": drafted / steps,
    }


def static(requests: Sequence[Request], table: CostTable, k: int) -> float:
    """Seconds of the requests at a fixed k (0: plain decoding)."""
    seconds = 0.0
    for request in requests:
        position = 0
        while position < request.tokens:
            left = request.tokens - position
            ran = min(k, min(BLOCK, left) - 1)
            position += min(ran + 1, request.potential[position], left)
            seconds += table.time_s(1, ran + 1)
    return seconds


def parse_settings(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml_value(value.strip())
    return out


def yaml_value(text: str) -> Any:
    """A number, a list of numbers written with ``/`` between them (``1/2/4``), or text."""
    if "/" in text:
        return [float(item) for item in text.split("/") if item]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def study(
    path: Path,
    variants: dict[str, dict[str, Any]],
    phase: str,
    seeds: int,
    burst: int = 1,
    spacing: int = 1,
) -> dict:
    report = load(path)
    runs = report["runs"]
    statics = sorted(
        {r["policy"] for r in runs if r["policy"].startswith("static-k")},
        key=lambda name: int(name.removeprefix("static-k")),
    )
    goodput_runs = [r for r in runs if r["policy"] == "goodput"]
    if not statics or not goodput_runs:
        raise SystemExit(f"{path}: needs a static-k<N> run and a goodput run (has {statics})")
    truth_policy = statics[-1]
    truth = next(r for r in runs if r["policy"] == truth_policy)
    requests = recorded_requests(truth, phase)
    times = step_times(goodput_runs, phase)
    tokens = sum(r.tokens for r in requests)
    out: dict[str, Any] = {
        "truth": truth_policy,
        "requests": len(requests),
        "tokens": tokens,
        "step_ms": {str(w): round(1e3 * s, 4) for w, s in sorted(times.items())},
        "recorded_tok_s": {
            name: statistics.fmean(r["phases"][phase]["tok_s"] for r in runs if r["policy"] == name)
            for name in ("no-spec", truth_policy, "goodput")
            if any(r["policy"] == name for r in runs)
        },
        "replayed": {},
    }
    table = step_table(times)
    no_spec_s = static(requests, table, 0)
    static_s = static(requests, table, int(truth_policy.removeprefix("static-k")))
    out["replayed"]["no-spec"] = {"tok_s": tokens / no_spec_s}
    out["replayed"][truth_policy] = {"tok_s": tokens / static_s}
    recorded = goodput_runs[0]["phases"][phase]["planner_view"]
    prior = {task: recorded["tasks"][task]["rates"] for task in ("math", "code", "chat")}
    out["prior"] = {"accept_rates": prior, "strength": PRIOR_STRENGTH}
    for name, update in variants.items():
        base = GoodputSpec().model_dump() | {
            "prior_accept_rates": prior,
            "prior_strength": PRIOR_STRENGTH,
        }
        spec = GoodputSpec.model_validate(base | update)
        per_seed = [replay(requests, table, spec, seed, burst, spacing) for seed in range(seeds)]
        seconds = statistics.fmean(r["seconds"] for r in per_seed)
        out["replayed"][name] = {
            "settings": update,
            "tok_s": tokens / seconds,
            "vs_static": static_s / seconds,
            "vs_no_spec": no_spec_s / seconds,
            "drafted_share": statistics.fmean(r["drafted_share"] for r in per_seed),
            "vs_static_per_seed": [round(static_s / r["seconds"], 4) for r in per_seed],
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="GPU-decisions results files")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="goodput settings to replay (repeatable); default: the shipped settings only",
    )
    parser.add_argument("--phase", default="math", help="a one-row phase of the file (math)")
    parser.add_argument("--seeds", type=int, default=3, help="probe-draw seeds per variant")
    parser.add_argument(
        "--burst", type=int, default=1, help="steps an engine call (default 1; CUDA: 4)"
    )
    parser.add_argument(
        "--spacing",
        type=int,
        default=1,
        help="calls a decision is held (default 1: every call decided; CUDA at one row: 8)",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    variants: dict[str, dict[str, Any]] = {"shipped": {}}
    for text in args.variant:
        name, sep, settings = text.partition(":")
        if not sep or not name:
            parser.error(f"--variant {text!r}: expected NAME:KEY=VALUE,...")
        variants[name] = parse_settings(settings)
    report = {
        "command": "python bench/plain_return_replay.py " + " ".join(sys.argv[1:]),
        "files": {
            path.name: study(path, variants, args.phase, args.seeds, args.burst, args.spacing)
            for path in args.results
        },
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
