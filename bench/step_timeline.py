"""Where each policy's time went, step by step: the GPU-decisions harness's raw calls binned.

Every run of ``bench/gpu_decisions.py`` keeps, per phase, one timeline entry per engine step
(``bench/decisions/driver.py``): rows, widest k, whether a request was admitted (a prefill
shared the step), step ms, ms waited for a two-phase step's host allocation, its allocation
ms, tokens verified (sum of k + rows) and tokens emitted. This tool pools the runs of each
policy over the given raw files (``.json`` or ``.json.gz``) and prints, per phase:

- per row bucket (1, 2, 4, ... rows, rounded up to a power of two) and admitted or not: steps
  per run, seconds per run and tokens emitted per ms: which kind of step a policy wins or
  loses on;
- its decode steps by finer row ranges (``row_ranges``: the powers of two halved above 16,
  the full batch alone): steps and seconds per run, tokens emitted per ms, the share of
  two-phase steps, and a step's ms, tokens verified and emitted;
- its drain (``drain``: the steps after the last one at the phase's concurrency, when no
  request joins any more and the phase is over once its longest row is): steps, seconds,
  drafting steps and one-row steps per run;
- its plain stretches (``plain_stretches``: 16 or more steps of k = 0 at half the phase's
  concurrency or more), with the planner's decision when the timeline carries it;
- for the full-batch decode steps (the phase's concurrency, nothing admitted): the mean step
  ms, wait and allocation ms, tokens verified and emitted, and the same per verified-token
  count (counts with at least ``--min-steps`` steps), so that policies compare at equal
  token counts (equal step graphs): how well each picks the slots at one cost.

    G=bench/results/gpu_decisions/synthetic-8b-ragged-triton-warm-priced_2026-12-04
    .venv/bin/python bench/step_timeline.py ${G}m*.json.gz \\
      --out bench/results/step_timeline_priced_2026-12-04.json

Pure reading: seconds on a laptop.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# timeline entry fields (bench/decisions/driver.py)
ROWS, KMAX, ADMITTED, MS, WAIT_MS, ALLOC_MS, VERIFIED, EMITTED, TWO_PHASE = range(9)
# since session 43 also the goodput planner's decision: its best drafting k, that k's expected
# rate over a plain step's, and the priced ms of a plain step and of that k's
DRAFT_K, DRAFT_GAIN, PLAIN_PRICED_MS, DRAFT_PRICED_MS = range(9, 13)
# a plain stretch of the full batch this long or longer is reported (``plain_stretches``)
MIN_PLAIN_STRETCH = 16
AROUND = 8  # steps before and after a stretch whose emitted tokens per ms are reported


def load(path: Path) -> dict[str, Any]:
    """One raw harness call (``.json`` or ``.json.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        data: dict[str, Any] = json.load(handle)
    if "runs" not in data:
        raise ValueError(f"{path}: not a raw gpu_decisions call (no 'runs'; a merged file?)")
    return data


def bucket(rows: int) -> int:
    """Rows rounded up to a power of two."""
    return 1 if rows <= 1 else 1 << (rows - 1).bit_length()


def summarise(calls: Iterable[dict[str, Any]], min_steps: int = 20) -> dict[str, Any]:
    """Per phase and policy: the row buckets and the full-batch decode steps (module doc)."""
    concurrency: dict[str, int] = {}
    # phase -> policy -> list of runs' timelines
    timelines: dict[str, dict[str, list[list[list[float]]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for call in calls:
        for phase in call.get("phases", []):
            concurrency[phase["name"]] = int(phase["concurrency"])
        for run in call["runs"]:
            for name, phase in run["phases"].items():
                timelines[name][run["policy"]].append(phase["timeline"])
    out: dict[str, Any] = {}
    for phase_name, by_policy in timelines.items():
        full = concurrency.get(phase_name)
        phase_out: dict[str, Any] = {}
        for policy, runs in sorted(by_policy.items()):
            phase_out[policy] = _policy(runs, full, min_steps)
        out[phase_name] = {"concurrency": full, "policies": phase_out}
    return out


def _policy(runs: list[list[list[float]]], full: int | None, min_steps: int) -> dict[str, Any]:
    n = len(runs)
    cells: dict[tuple[int, bool], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    steps = [entry for timeline in runs for entry in timeline]
    for entry in steps:
        cell = cells[(bucket(int(entry[ROWS])), bool(entry[ADMITTED]))]
        cell[0] += 1
        cell[1] += entry[MS]
        cell[2] += entry[EMITTED]
    buckets = [
        {
            "rows": rows,
            "admitted": admitted,
            "steps_per_run": round(count / n, 1),
            "s_per_run": round(ms / n / 1e3, 3),
            "emitted_per_ms": round(emitted / ms, 3) if ms else None,
        }
        for (rows, admitted), (count, ms, emitted) in sorted(cells.items())
    ]
    total_ms = sum(entry[MS] for entry in steps)
    result: dict[str, Any] = {
        "runs": n,
        "s_per_run": round(total_ms / n / 1e3, 3),
        "emitted_per_ms": round(sum(e[EMITTED] for e in steps) / total_ms, 3) if total_ms else None,
        "buckets": buckets,
        "modes": _modes(steps, full, n),
        "row_ranges": row_ranges(steps, full, n),
    }
    gains = drafting_gains(runs)
    if gains:
        result["drafting_gains"] = gains
    ends = drain(runs, full)
    if ends is not None:
        result["drain"] = ends
    stretches = [
        {"run": index, **stretch}
        for index, timeline in enumerate(runs)
        for stretch in plain_stretches(timeline, full)
    ]
    if stretches:
        result["plain_stretches"] = stretches
    decode = [e for e in steps if full is not None and e[ROWS] == full and not e[ADMITTED]]
    if decode:
        by_tokens: dict[int, list[list[float]]] = defaultdict(list)
        for entry in decode:
            by_tokens[int(entry[VERIFIED])].append(entry)
        result["full_decode"] = {
            **_means(decode),
            "by_verified_tokens": {
                str(tokens): _means(entries)
                for tokens, entries in sorted(by_tokens.items())
                if len(entries) >= min_steps
            },
        }
    return result


def drain(runs: list[list[list[float]]], full: int | None) -> dict[str, Any] | None:
    """Per run, the mean of the steps after the run's last step at ``full`` rows (none: the
    run never filled the batch, and it is left out): steps, seconds, drafting steps (widest
    k > 0) and steps of one row. None when no run filled it."""
    tails = []
    for timeline in runs:
        last = max((i for i, e in enumerate(timeline) if full and e[ROWS] >= full), default=None)
        if last is not None:
            tails.append(timeline[last + 1 :])
    if not tails:
        return None
    n = len(tails)
    return {
        "runs": n,
        "steps_per_run": round(sum(map(len, tails)) / n, 1),
        "s_per_run": round(sum(e[MS] for tail in tails for e in tail) / n / 1e3, 4),
        "drafting_steps_per_run": round(sum(e[KMAX] > 0 for t in tails for e in t) / n, 1),
        "one_row_steps_per_run": round(sum(e[ROWS] == 1 for t in tails for e in t) / n, 1),
    }


def plain_stretches(
    timeline: Sequence[Sequence[float]], full: int | None, least: int = MIN_PLAIN_STRETCH
) -> list[dict[str, Any]]:
    """Runs of at least ``least`` consecutive steps with k = 0 of a batch at least half the
    phase's concurrency: where each starts and how long it is, and, from entries that carry
    the planner's decision (13 fields), its best drafting k, expected gain over plain and
    priced ms at the stretch's first and last step, with the emitted tokens per ms of the
    ``AROUND`` steps before and after it (why a batch went plain, and whether it should have)."""
    rows_least = (full or 1) / 2
    out: list[dict[str, Any]] = []
    start = None
    for index in range(len(timeline) + 1):
        plain = (
            index < len(timeline)
            and timeline[index][KMAX] == 0
            and timeline[index][ROWS] >= rows_least
        )
        if plain and start is None:
            start = index
        if plain or start is None:
            continue
        if index - start >= least:
            first, last = timeline[start], timeline[index - 1]
            stretch: dict[str, Any] = {
                "start": start,
                "steps": index - start,
                "rows": int(first[ROWS]),
                "before_emitted_per_ms": _rate(timeline[max(0, start - AROUND) : start]),
                "during_emitted_per_ms": _rate(timeline[start:index]),
                "after_emitted_per_ms": _rate(timeline[index : index + AROUND]),
            }
            if len(first) > DRAFT_PRICED_MS:
                stretch["decision_first"] = list(first[DRAFT_K:])
                stretch["decision_last"] = list(last[DRAFT_K:])
            out.append(stretch)
        start = None
    return out


def _rate(entries: Sequence[Sequence[float]]) -> float | None:
    ms = sum(e[MS] for e in entries)
    return round(sum(e[EMITTED] for e in entries) / ms, 3) if ms else None


def _means(entries: Sequence[Sequence[float]]) -> dict[str, float]:
    count = len(entries)
    ms = sum(e[MS] for e in entries)
    return {
        "steps": count,
        "ms": round(ms / count, 3),
        "wait_ms": round(sum(e[WAIT_MS] for e in entries) / count, 3),
        "alloc_ms": round(sum(e[ALLOC_MS] for e in entries) / count, 3),
        "verified": round(sum(e[VERIFIED] for e in entries) / count, 1),
        "emitted": round(sum(e[EMITTED] for e in entries) / count, 1),
        "emitted_per_ms": round(sum(e[EMITTED] for e in entries) / ms, 3),
    }


def _modes(steps: list[list[float]], full: int | None, runs: int) -> list[dict[str, Any]]:
    """The decode steps (no admission) by batch (the phase's full batch, or fewer rows: its
    ramp and drain) and mode: plain (k = 0), one-phase drafting, two-phase; per run."""
    cells: dict[tuple[bool, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for entry in steps:
        if entry[ADMITTED]:
            continue
        two_phase = len(entry) > TWO_PHASE and entry[TWO_PHASE]  # (older files: no field)
        mode = "two-phase" if two_phase else "one-phase" if entry[KMAX] else "plain"
        cell = cells[(full is not None and entry[ROWS] >= full, mode)]
        cell[0] += 1
        cell[1] += entry[MS]
        cell[2] += entry[EMITTED]
    order = {"plain": 0, "one-phase": 1, "two-phase": 2}
    return [
        {
            "batch": "full" if is_full else "fewer",
            "mode": mode,
            "steps_per_run": round(count / runs, 1),
            "s_per_run": round(ms / runs / 1e3, 3),
            "emitted_per_ms": round(emitted / ms, 3) if ms else None,
        }
        for (is_full, mode), (count, ms, emitted) in sorted(
            cells.items(), key=lambda item: (not item[0][0], order[item[0][1]])
        )
    ]


def ranges_of(full: int) -> list[tuple[int, int]]:
    """Row ranges of ``row_ranges`` for a phase of concurrency ``full``: 1, the powers of two
    (2-4, 5-8, 9-16), above 16 each power of two in halves (17-24, 25-32, 33-48, 49-63), and
    the full batch alone."""
    out: list[tuple[int, int]] = [(1, 1)]
    low, high = 2, 4
    while low < full:
        top = min(high, full - 1)
        if high > 16:
            middle = (low - 1 + high) // 2
            out += [(low, min(middle, top)), (middle + 1, top)] if middle < top else [(low, top)]
        else:
            out.append((low, top))
        low, high = high + 1, high * 2
    if full > 1:
        out.append((full, full))
    return out


def row_ranges(steps: list[list[float]], full: int | None, runs: int) -> list[dict[str, Any]]:
    """The decode steps (no admission) by rows (``ranges_of`` the phase's concurrency), per
    run: steps and seconds, emitted tokens a ms, the share of two-phase steps, and a step's
    ms, tokens verified and tokens emitted; where one policy's steps of a few rows outrun
    another's (session 55: vLLM's rule against goodput in the 8B arm's mixed drain)."""
    if full is None:
        return []
    top = max([full, *(int(e[ROWS]) for e in steps)])
    ranges = ranges_of(full) + ([(full + 1, top)] if top > full else [])
    cells: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0])
    for entry in steps:
        if entry[ADMITTED]:
            continue
        rows = int(entry[ROWS])
        where = next(span for span in ranges if span[0] <= rows <= span[1])
        cell = cells[where]
        cell[0] += 1
        cell[1] += entry[MS]
        cell[2] += entry[EMITTED]
        cell[3] += entry[VERIFIED]
        cell[4] += bool(len(entry) > TWO_PHASE and entry[TWO_PHASE])
    return [
        {
            "rows": f"{low}" if low == high else f"{low}-{high}",
            "steps_per_run": round(count / runs, 1),
            "s_per_run": round(ms / runs / 1e3, 3),
            "emitted_per_ms": round(emitted / ms, 3) if ms else None,
            "two_phase_share": round(two / count, 3),
            "ms_per_step": round(ms / count, 3),
            "verified_per_step": round(verified / count, 1),
            "emitted_per_step": round(emitted / count, 1),
        }
        for (low, high), (count, ms, emitted, verified, two) in sorted(cells.items())
    ]


# row regions of ``drafting_gains``: (label, fewest rows, most rows)
GAIN_REGIONS = (("1-8", 1, 8), ("9-32", 9, 32), ("33+", 33, 1 << 30))


def drafting_gains(runs: list[list[list[float]]]) -> list[dict[str, Any]]:
    """What the batch-wide decisions expected of their one-phase drafting steps against what
    those steps gave: per row region, the mean expected gain (``DRAFT_GAIN``: the chosen k's
    tokens a second over a plain step's, as priced) and the mean realized one (the step's
    emitted tokens a ms over rows / the median ms, the upper middle, of the same run's plain
    steps at the nearest row count within 2; steps without one left out), and the priced ms
    over the measured ms of the drafting step and of that plain step. Steps that admit, two-phase
    steps and timelines without the planner's fields (before session 43) are left out."""
    cells: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for timeline in runs:
        plain: dict[int, list[float]] = defaultdict(list)
        for e in timeline:
            two_phase = len(e) > TWO_PHASE and e[TWO_PHASE]
            if e[KMAX] == 0 and not e[ADMITTED] and not two_phase:
                plain[int(e[ROWS])].append(e[MS])
        for e in timeline:
            if len(e) <= DRAFT_PRICED_MS or e[KMAX] == 0 or e[ADMITTED] or e[TWO_PHASE]:
                continue
            if e[DRAFT_GAIN] <= 0 or e[MS] <= 0:
                continue
            rows = int(e[ROWS])
            near = next(
                (plain[r] for r in (rows, rows - 1, rows + 1, rows - 2, rows + 2) if plain.get(r)),
                None,
            )
            if near is None:
                continue
            plain_ms = sorted(near)[len(near) // 2]
            label = next(name for name, lo, hi in GAIN_REGIONS if lo <= rows <= hi)
            cell = cells[label]
            cell[0] += 1
            cell[1] += e[DRAFT_GAIN]
            cell[2] += (e[EMITTED] / e[MS]) / (rows / plain_ms)
            cell[3] += e[DRAFT_PRICED_MS] / e[MS]
            cell[4] += e[PLAIN_PRICED_MS] / plain_ms
    return [
        {
            "rows": name,
            "steps": int(cells[name][0]),
            "expected_gain": round(cells[name][1] / cells[name][0], 3),
            "realized_gain": round(cells[name][2] / cells[name][0], 3),
            "draft_priced_over_measured": round(cells[name][3] / cells[name][0], 3),
            "plain_priced_over_measured": round(cells[name][4] / cells[name][0], 3),
        }
        for name, _, _ in GAIN_REGIONS
        if name in cells
    ]


def render(summary: dict[str, Any]) -> str:
    """The summary as text, one block per phase."""
    lines: list[str] = []
    for phase, data in summary.items():
        lines.append(f"== {phase} (concurrency {data['concurrency']})")
        for policy, info in data["policies"].items():
            lines.append(
                f"{policy}: {info['runs']} runs, {info['s_per_run']:.2f} s a run, "
                f"{info['emitted_per_ms']} emitted/ms"
            )
            for cell in info["buckets"]:
                tag = "admitted" if cell["admitted"] else "decode"
                lines.append(
                    f"  {cell['rows']:>4} rows {tag:8s} {cell['steps_per_run']:>7} steps "
                    f"{cell['s_per_run']:.3f} s {cell['emitted_per_ms']} emitted/ms"
                )
            for cell in info["modes"]:
                lines.append(
                    f"  {cell['batch']:>5} batch {cell['mode']:9s} {cell['steps_per_run']:>7} "
                    f"steps {cell['s_per_run']:.3f} s {cell['emitted_per_ms']} emitted/ms"
                )
            for cell in info.get("row_ranges", []):
                lines.append(
                    f"  {cell['rows']:>7} rows: {cell['steps_per_run']:>6} steps "
                    f"{cell['s_per_run']:.3f} s {cell['emitted_per_ms']} emitted/ms, "
                    f"two-phase {cell['two_phase_share']:.0%}, {cell['ms_per_step']} ms a step, "
                    f"{cell['verified_per_step']} verified, {cell['emitted_per_step']} emitted"
                )
            for cell in info.get("drafting_gains", []):
                lines.append(
                    f"  drafting at {cell['rows']:>4} rows: {cell['steps']} steps, expected gain "
                    f"{cell['expected_gain']}, realized {cell['realized_gain']} (priced / "
                    f"measured: draft {cell['draft_priced_over_measured']}, plain "
                    f"{cell['plain_priced_over_measured']})"
                )
            ends = info.get("drain")
            if ends:
                lines.append(
                    f"  drain: {ends['steps_per_run']} steps {ends['s_per_run']:.3f} s a run, "
                    f"{ends['drafting_steps_per_run']} drafting, "
                    f"{ends['one_row_steps_per_run']} at one row"
                )
            for stretch in info.get("plain_stretches", []):
                decision = stretch.get("decision_first")
                said = (
                    f"; k = {decision[0]} priced {decision[1]:.3f}x plain "
                    f"({decision[2]} / {decision[3]} ms)"
                    if decision
                    else ""
                )
                lines.append(
                    f"  plain stretch: run {stretch['run']}, step {stretch['start']}, "
                    f"{stretch['steps']} steps at {stretch['rows']} rows; emitted/ms "
                    f"{stretch['before_emitted_per_ms']} before, "
                    f"{stretch['during_emitted_per_ms']} during, "
                    f"{stretch['after_emitted_per_ms']} after{said}"
                )
            decode = info.get("full_decode")
            if decode:
                lines.append(
                    f"  full decode: {decode['steps']} steps, {decode['ms']} ms "
                    f"(wait {decode['wait_ms']}, alloc {decode['alloc_ms']}), "
                    f"{decode['verified']} verified, {decode['emitted']} emitted, "
                    f"{decode['emitted_per_ms']} emitted/ms"
                )
                for tokens, cell in decode["by_verified_tokens"].items():
                    lines.append(
                        f"    at {tokens} tokens: {cell['steps']} steps, {cell['ms']} ms, "
                        f"{cell['emitted']} emitted, {cell['emitted_per_ms']} emitted/ms"
                    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("calls", nargs="+", type=Path, help="raw gpu_decisions calls")
    parser.add_argument("--out", type=Path, help="also write the summary as JSON here")
    parser.add_argument(
        "--min-steps",
        type=int,
        default=20,
        help="token counts with fewer full-batch decode steps are left out (default 20)",
    )
    args = parser.parse_args(argv)
    if args.min_steps < 1:
        parser.error("--min-steps must be >= 1")
    try:
        calls = [load(path) for path in args.calls]
    except (OSError, ValueError) as exc:
        print(f"step_timeline: {exc}", file=sys.stderr)
        return 2
    summary = summarise(calls, args.min_steps)
    print(render(summary))
    if args.out:
        record = {
            "command": "python bench/step_timeline.py "
            + " ".join(str(path) for path in args.calls)
            + f" --min-steps {args.min_steps}",
            "phases": summary,
        }
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
