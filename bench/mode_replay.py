"""What the auto step mode's chooser concluded from the steps a GPU call recorded, with and
without the admissions' prefill in the steps it times (issue 16, session 54), and with and
without the plain steps (session 56).

Until session 54 the step controller timed each engine call from one ``plan`` to the next,
and the engine prefills newly admitted requests before it plans: an admission's prefill
landed on the steps of the call before it. This replays a policy's recorded steps (the
GPU-decisions harness's raw ``timeline``: rows, two-phase or not, emitted tokens, ms, whether
the call admitted) through ``policies.step_mode.StepModeChooser`` in the order they ran (all
of the policy's runs, one chooser, as its warm policy kept one), both ways:

- ``blind`` (before session 54): an admitting call's extra time over a call of its kind
  without admission (its prefill) is moved onto the call before it;
- ``told`` (since): the prefill is left out, the admitting call timed as one without it;
- ``drafting`` (since session 56): as ``told``, and plain steps (one phase, k = 0) are timed
  into neither mode, so paired blocks compare drafting steps only;
- ``live``, where the raw file has them (calls since session 56): the steps exactly as the
  live chooser was told them (each phase's ``mode_told``), beside the harness's own times.

Calls are the timeline's runs of consecutive steps that share a time and an admission flag
(the harness splits a call's time evenly over its steps); a call's kind is its mode and its
row bucket, and "a call of its kind without admission" is the median per-step ms of such
calls in the same run. The chooser only records buckets from ``--min-rows`` rows (the
policy's ``slots_min_batch``). Prints, per policy, each bucket's paired estimate (two-phase
over one-phase tokens a second) and its pooled rates each way; ``--json`` writes them.
``--with-warm`` replays the policy's warm pass first (``warm_runs``, where the harness kept
one), as its chooser saw it. Not a counterfactual: the recorded modes are the ones the
recorded chooser picked.

    G=bench/results/gpu_decisions
    .venv/bin/python bench/mode_replay.py $G/real-pair_2026-12-07s5{1d,2a,2b,2d,3b,3c}.json.gz \\
      --policy goodput --json bench/results/mode_replay_real_pair_2026-12-07s54.json
    .venv/bin/python bench/mode_replay.py $G/real-pair_2026-12-07s56{b,d,e}.json.gz \\
      --policy goodput --with-warm --json bench/results/mode_replay_real_pair_2026-12-07s56.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.step_timeline import ADMITTED, EMITTED, KMAX, MS, ROWS, TWO_PHASE, load
from policies.step_mode import ModeSettings, StepModeChooser

# rows, two-phase, admitted, emitted, ms a step, widest k
Call = tuple[int, bool, bool, list[int], float, int]
WAYS = ("blind", "told", "drafting")


def calls_of(timeline: Sequence[Sequence[Any]]) -> list[Call]:
    """The timeline's steps grouped into engine calls (consecutive steps of one time and one
    admission flag: the harness splits a call's time evenly over its steps)."""
    calls: list[Call] = []
    for step in timeline:
        key = (float(step[MS]), bool(step[ADMITTED]))
        if calls and (calls[-1][4], calls[-1][2]) == key and len(calls[-1][3]) < 16:
            calls[-1][3].append(int(step[EMITTED]))
            continue
        rows, two_phase, k = int(step[ROWS]), bool(step[TWO_PHASE]), int(step[KMAX])
        calls.append((rows, two_phase, key[1], [int(step[EMITTED])], key[0], k))
    return calls


def replay(
    runs: Sequence[Sequence[Sequence[Any]]],
    min_rows: int,
    settings: ModeSettings,
    told: Sequence[Sequence[Sequence[Any]]] | None = None,
) -> dict[str, Any]:
    """Each way's chooser over the runs' timelines in order (see the module docstring); with
    ``told`` (each run's ``mode_told``: the steps as the live chooser was told them, rows,
    two-phase, tokens, ms), also ``live``: a chooser fed exactly those."""
    choosers = {way: StepModeChooser(settings) for way in WAYS}
    if told is not None:
        live = choosers["live"] = StepModeChooser(settings)
        for entries in told:
            for rows, two_phase, tokens, ms in entries:
                if rows >= min_rows:
                    live.record(int(rows), bool(two_phase), int(tokens), float(ms) / 1e3)
    for timeline in runs:
        calls = calls_of(timeline)
        plain: dict[tuple[int, bool], list[float]] = defaultdict(list)
        for rows, two_phase, admitted, _, ms, _ in calls:
            if not admitted:
                plain[(StepModeChooser.bucket(rows), two_phase)].append(ms)
        usual = {kind: statistics.median(times) for kind, times in plain.items()}
        timed: dict[str, list[list[float]]] = {"blind": [], "told": []}
        for rows, two_phase, admitted, emitted, ms, _ in calls:
            clean = ms
            if admitted:
                clean = min(ms, usual.get((StepModeChooser.bucket(rows), two_phase), ms))
            timed["told"].append([clean] * len(emitted))
            timed["blind"].append([clean] * len(emitted))
            extra = (ms - clean) * len(emitted)
            if extra > 0 and len(timed["blind"]) > 1:  # onto the call before it
                before = timed["blind"][-2]
                before[:] = [t + extra / len(before) for t in before]
        timed["drafting"] = timed["told"]
        for way in WAYS:
            chooser = choosers[way]
            for (rows, two_phase, _, emitted, _, k), times in zip(calls, timed[way], strict=True):
                if rows < min_rows or (way == "drafting" and not two_phase and k == 0):
                    continue
                for tokens, ms in zip(emitted, times, strict=True):
                    chooser.record(rows, two_phase, tokens, ms / 1e3)
    return {
        way: [
            {
                "rows": b.rows,
                "paired_ratio": None if b.paired_ratio is None else round(b.paired_ratio, 4),
                "pairs": b.pairs,
                "one_phase_tok_s": None if b.one_phase_tok_s is None else round(b.one_phase_tok_s),
                "two_phase_tok_s": None if b.two_phase_tok_s is None else round(b.two_phase_tok_s),
            }
            for b in chooser.buckets()
        ]
        for way, chooser in choosers.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("raw", nargs="+", type=Path, help="raw gpu_decisions calls")
    parser.add_argument("--policy", default="goodput", help="the policy to replay")
    parser.add_argument("--phase", default="mixed", help="the phase to replay")
    parser.add_argument("--min-rows", type=int, default=32, help="slots_min_batch")
    parser.add_argument(
        "--with-warm", action="store_true", help="replay the policy's warm pass first"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"command": "python " + " ".join(sys.argv), "calls": {}}
    for path in args.raw:
        data = load(path)
        runs = sorted(
            (r for r in data["runs"] if r["policy"] == args.policy), key=lambda r: r["repeat"]
        )
        if not runs:
            raise SystemExit(f"{path}: no runs of policy {args.policy!r}")
        warm = (data.get("warm_runs") or {}).get(args.policy) if args.with_warm else None
        runs = ([warm] if warm else []) + runs
        timelines = [r["phases"][args.phase]["timeline"] for r in runs]
        told = [r["phases"][args.phase].get("mode_told") for r in runs]
        known = None if any(t is None for t in told) else told  # (since session 56)
        result = replay(timelines, args.min_rows, ModeSettings(), known)
        report["calls"][path.name] = result
        for way, buckets in result.items():
            for b in buckets:
                print(
                    f"{path.name} {args.policy} {way:8s} rows<={b['rows']:3d} paired "
                    f"{b['paired_ratio']} ({b['pairs']} pairs) one-phase {b['one_phase_tok_s']} "
                    f"two-phase {b['two_phase_tok_s']} tok/s"
                )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
