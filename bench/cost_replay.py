"""What the goodput policy's online cost model believed, replayed from a harness call's steps.

A raw file of ``bench/gpu_decisions.py`` keeps every step of every run (``timeline``: rows,
widest k, whether the call admitted, ms, ...) and the arm's start-up cost table. This feeds
one policy's decode steps (admitting calls left out: their time holds a prefill), run by run
and phase by phase in the order they ran, into a ``CostModel`` built as the harness builds
goodput's (the arm's table; the engine's width multiple, 1 on a ragged arm, else
``GoodputSpec()``'s; its learning rate), and prints after each phase the priced step time at
k = 0 and the block's k's for a batch, against the table's and against the plain and k = 7
steps the file measured at that batch; and, before anything is learnt, every shared k's
expected rate over a plain step's by the start-up table and the arm's population rates
(``shared_k_prices``). The step times are the harness's (a call's wall time over its steps),
not the runner's own, so the replay approximates the run's fit; it found the fault fixed in
session 38 (an overhead fitted at a row that had run one width: docs/goodput.md "Online
correction").

    .venv/bin/python bench/cost_replay.py \\
      bench/results/gpu_decisions/real-pair_2026-12-05s37c.json.gz --batch 64 \\
      --out bench/results/cost_replay/real-pair_2026-12-05s37c_b64.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policies.acceptance import expected_by_k  # noqa: E402
from policies.costmodel import CostModel, CostTable, padded_width  # noqa: E402
from policies.model import GoodputSpec  # noqa: E402

PHASES = ("math", "mixed", "chat")
KS = (0, 7, 15)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", type=Path, help="a raw file of bench/gpu_decisions.py (.json.gz)")
    parser.add_argument("--policy", default="goodput", help="whose steps to replay")
    parser.add_argument("--batch", type=int, default=64, help="the batch size to price")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be >= 1")
    if not args.raw.is_file():
        parser.error(f"{args.raw}: no such file")
    return args


def arm_table(arm_info: dict[str, Any]) -> CostTable:
    """The start-up table a raw file's arm priced steps with (ms in the file, s here)."""
    rows = arm_info["cost_table_ms"]
    batches = sorted(int(b) for b in rows)
    widths = sorted(int(w) for w in rows[str(batches[0])])
    buckets = [
        (int(b), tuple((int(n), t / 1e3) for n, t in sorted((int(n), t) for n, t in p.items())))
        for b, p in sorted(arm_info.get("cost_buckets_ms", {}).items(), key=lambda x: int(x[0]))
    ]
    return CostTable(
        tuple(batches),
        tuple(widths),
        tuple(tuple(rows[str(b)][str(w)] / 1e3 for w in widths) for b in batches),
        includes_draft=True,
        token_buckets=tuple(buckets),
    )


def measured_ms(raw: dict[str, Any], batch: int) -> dict[str, float]:
    """Mean ms of the decode steps of exactly ``batch`` rows, by k, over the runs of no-spec
    and the static k's (one-phase steps, every row at its k: what the table prices)."""
    times: dict[int, list[float]] = {}
    for run in raw["runs"]:
        if run["policy"] != "no-spec" and not run["policy"].startswith("static-k"):
            continue
        for phase in run["phases"].values():
            for rows, k, admitted, ms, *_ in phase.get("timeline", ()):
                if rows == batch and not admitted:
                    times.setdefault(k, []).append(ms)
    return {str(k): round(statistics.fmean(v), 3) for k, v in sorted(times.items())}


def _drafted(k: int, more: list[Any]) -> float:
    """1.0 if a timeline step ran the draft: k > 0, or a two-phase step (the entry's ninth
    field, since session 42; earlier files cannot tell one that verified nothing from plain)."""
    return float(k > 0 or (len(more) > 4 and more[4] == 1))


def replay(raw: dict[str, Any], policy: str, batch: int) -> list[dict[str, Any]]:
    spec = GoodputSpec()
    table = arm_table(raw["arm_info"])
    # the engine's multiple, as the harness hands it (1 on a ragged engine: every k its price)
    ragged = raw["arm_info"].get("verify_mode") == "ragged"
    model = CostModel(
        table=table,
        block_size=raw["arm_info"]["block_size"],
        verify_width_multiple=1 if ragged else spec.verify_width_multiple,
        draft_cost_fraction=spec.draft_cost_fraction,
        learning_rate=spec.cost_learning_rate,
    )
    ks = [k for k in KS if k < raw["arm_info"]["block_size"]]
    row = min(range(len(table.batch_sizes)), key=lambda i: abs(table.batch_sizes[i] - batch))
    out = []
    for run in raw["runs"]:
        if run["policy"] != policy:
            continue
        for name in PHASES:
            steps = [
                (
                    rows,
                    float(padded_width(k, model.verify_width_multiple)),
                    _drafted(k, more),
                    ms / 1e3,
                )
                for rows, k, admitted, ms, *more in run["phases"][name].get("timeline", ())
                if not admitted
            ]
            model.observe_steps(steps)
            snap = model.snapshot()
            priced = {k: 1e3 * snap.step_time_s(batch, k) for k in ks}
            out.append(
                {
                    "repeat": run["repeat"],
                    "phase": name,
                    "steps": len(steps),
                    "priced_ms": {str(k): round(v, 3) for k, v in priced.items()},
                    "priced_k7_over_plain": round(priced[7] / priced[0], 3)
                    if 7 in priced
                    else None,
                    "row": table.batch_sizes[row],
                    "row_correction": round(snap.corrections[row], 4),
                    "row_overhead_ms": round(1e3 * snap.overheads_s[row], 4),
                    # (None from code before session 38, which did not count them)
                    "row_widths_seen": getattr(model, "widths_seen", lambda _: None)(row),
                }
            )
    return out


def shared_k_prices(raw: dict[str, Any]) -> dict[str, Any]:
    """Before anything is learnt: every k's expected tokens a second over a plain step's for
    one shared k, by the arm's start-up table as the engine now hands it (its multiple; on a
    ragged arm every k at the token count its step runs) and the arm's population rates
    (``global_rates``, else the pair's ``measured_rates``), at 8 rows on the chat phase's mix
    and 32 / 48 / 64 rows on the mixed phase's; and the best k."""
    info = raw["arm_info"]
    rates = info.get("global_rates") or info.get("measured_rates")
    if not rates:
        return {}
    ragged = info.get("verify_mode") == "ragged"
    spec = GoodputSpec()
    model = CostModel(
        table=arm_table(info),
        block_size=info["block_size"],
        verify_width_multiple=1 if ragged else spec.verify_width_multiple,
    )
    cost = model.snapshot()
    mixes = {phase["name"]: phase["mix"] for phase in raw.get("phases", ())}
    expected = {task: expected_by_k(values) for task, values in rates.items()}
    out: dict[str, Any] = {}
    for batch, phase in ((8, "chat"), (32, "mixed"), (48, "mixed"), (64, "mixed")):
        mix = mixes.get(phase)
        if mix is None:
            continue
        plain = cost.step_time_s(batch, 0)
        ks = range(info["block_size"])
        gain = {
            k: sum(share * expected[task][k] for task, share in mix.items() if task in expected)
            * plain
            / cost.step_time_s(batch, k)
            for k in ks
        }
        best = max(gain, key=lambda k: gain[k])
        out[f"{batch}x{phase}"] = {
            "best_k": best,
            "gain_over_plain": {str(k): round(v, 4) for k, v in gain.items()},
        }
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data = args.raw.read_bytes()
    raw = json.loads(gzip.decompress(data) if args.raw.suffix == ".gz" else data)
    if not any(run["policy"] == args.policy for run in raw["runs"]):
        names = sorted({run["policy"] for run in raw["runs"]})
        sys.exit(f"{args.raw}: no runs of policy {args.policy!r} (has {', '.join(names)})")
    table = arm_table(raw["arm_info"])
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    report = {
        "command": "python bench/cost_replay.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "code": commit,
        "raw": args.raw.name,
        "policy": args.policy,
        "batch": args.batch,
        "table_ms": {
            str(k): round(1e3 * table.time_s(args.batch, padded_width(k, 8)), 3) for k in KS
        },
        "measured_ms_by_k": measured_ms(raw, args.batch),
        "replay": replay(raw, args.policy, args.batch),
        "shared_k_prices": shared_k_prices(raw),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
