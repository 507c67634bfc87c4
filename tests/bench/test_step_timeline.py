"""bench/step_timeline.py: the harness's per-step timelines binned per policy."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.step_timeline import bucket, main, ranges_of, row_ranges, summarise


def _call() -> dict[str, object]:
    # entries: rows, kmax, admitted, ms, wait_ms, alloc_ms, verified, emitted
    full_a = [[4, 7, 0, 10.0, 0.0, 0.0, 32, 20]] * 3 + [[4, 7, 1, 20.0, 0.0, 0.0, 32, 10]]
    full_b = [[4, 5, 0, 8.0, 0.5, 1.0, 24, 16]] * 2 + [[3, 5, 0, 6.0, 0.0, 0.0, 18, 9]]
    return {
        "phases": [{"name": "busy", "concurrency": 4, "num_requests": 8, "mix": {}}],
        "runs": [
            {"policy": "a", "phases": {"busy": {"timeline": full_a}}},
            {"policy": "a", "phases": {"busy": {"timeline": full_a}}},
            {"policy": "b", "phases": {"busy": {"timeline": full_b}}},
        ],
    }


def test_buckets_round_rows_up_to_a_power_of_two() -> None:
    assert [bucket(r) for r in (0, 1, 2, 3, 4, 5, 33, 64)] == [1, 1, 2, 4, 4, 8, 64, 64]


def test_row_ranges_halve_the_powers_of_two_above_16_and_keep_the_full_batch_alone() -> None:
    assert ranges_of(1) == [(1, 1)]
    assert ranges_of(8) == [(1, 1), (2, 4), (5, 7), (8, 8)]
    assert ranges_of(64) == [
        (1, 1), (2, 4), (5, 8), (9, 16), (17, 24), (25, 32), (33, 48), (49, 63), (64, 64)
    ]  # fmt: skip
    assert ranges_of(40)[-2:] == [(33, 39), (40, 40)]


def test_row_ranges_rate_the_decode_steps_by_rows_and_mode() -> None:
    """``row_ranges``: steps that admit nothing, by rows; per run, with the two-phase share
    and a step's ms, tokens verified and emitted; rows above the concurrency get a range."""
    steps = [
        [64, 7, 0, 20.0, 0.0, 0.0, 448, 300, 1],  # full, two-phase
        [40, 7, 0, 16.0, 0.0, 0.0, 280, 160, 1],  # 33-48, two-phase
        [40, 7, 0, 14.0, 0.0, 0.0, 320, 140, 0],  # 33-48, one phase
        [40, 7, 1, 30.0, 0.0, 0.0, 320, 140, 0],  # admits: left out
        [20, 0, 0, 10.0, 0.0, 0.0, 20, 20],  # 17-24, plain (an older entry: no mode field)
        [70, 0, 0, 22.0, 0.0, 0.0, 70, 70, 0],  # above the concurrency
    ]
    cells = {cell["rows"]: cell for cell in row_ranges(steps, 64, runs=2)}
    assert list(cells) == ["17-24", "33-48", "64", "65-70"]
    mid = cells["33-48"]
    assert mid["steps_per_run"] == 1.0 and mid["s_per_run"] == 0.015
    assert mid["emitted_per_ms"] == pytest.approx(10.0) and mid["two_phase_share"] == 0.5
    assert (mid["ms_per_step"], mid["verified_per_step"], mid["emitted_per_step"]) == (
        15.0,
        300.0,
        150.0,
    )
    assert cells["17-24"]["two_phase_share"] == 0.0 and cells["64"]["two_phase_share"] == 1.0
    assert row_ranges(steps, None, runs=1) == []


def test_policies_pool_their_runs_per_row_bucket_and_token_count() -> None:
    summary = summarise([_call()], min_steps=2)["busy"]
    assert summary["concurrency"] == 4
    a = summary["policies"]["a"]
    assert a["runs"] == 2 and a["s_per_run"] == pytest.approx(0.05)
    decode, admitted = a["buckets"]
    assert (decode["rows"], decode["admitted"], decode["steps_per_run"]) == (4, False, 3.0)
    assert decode["emitted_per_ms"] == pytest.approx(2.0)
    assert admitted["admitted"] and admitted["emitted_per_ms"] == pytest.approx(0.5)
    # full decode: the phase's concurrency, nothing admitted
    assert a["full_decode"]["steps"] == 6 and a["full_decode"]["emitted"] == 20.0
    b = summary["policies"]["b"]["full_decode"]
    assert b["steps"] == 2 and b["wait_ms"] == 0.5 and b["alloc_ms"] == 1.0
    assert list(b["by_verified_tokens"]) == ["24"]
    # a token count under --min-steps is left out
    assert (
        summarise([_call()], min_steps=3)["busy"]["policies"]["b"]["full_decode"][
            "by_verified_tokens"
        ]
        == {}
    )


def test_decode_steps_are_split_by_batch_and_mode() -> None:
    """``modes``: the steps that admit nothing, at the full batch or fewer rows (a ramp or a
    drain), plain, one-phase drafting or two-phase (the timeline's ninth field; older files
    without it count as one phase)."""
    steps = [
        [4, 0, 0, 2.0, 0.0, 0.0, 4, 4, 0],  # full, plain
        [3, 0, 0, 1.5, 0.0, 0.0, 3, 3, 0],  # fewer, plain
        [3, 12, 0, 4.0, 0.0, 0.0, 39, 9, 0],  # fewer, one-phase
        [3, 10, 0, 5.0, 0.0, 2.0, 6, 6, 1],  # fewer, two-phase
        [3, 10, 1, 9.0, 0.0, 2.0, 6, 6, 1],  # admitting: left out
        [3, 7, 0, 3.0, 0.0, 0.0, 24, 6],  # an older entry: one-phase
    ]
    call = {
        "phases": [{"name": "busy", "concurrency": 4}],
        "runs": [{"policy": "a", "phases": {"busy": {"timeline": steps}}}],
    }
    modes = summarise([call])["busy"]["policies"]["a"]["modes"]
    seen = {(m["batch"], m["mode"]): (m["steps_per_run"], m["emitted_per_ms"]) for m in modes}
    assert seen == {
        ("full", "plain"): (1.0, 2.0),
        ("fewer", "plain"): (1.0, 2.0),
        ("fewer", "one-phase"): (2.0, round(15 / 7, 3)),
        ("fewer", "two-phase"): (1.0, 1.2),
    }
    assert [m["mode"] for m in modes] == ["plain", "plain", "one-phase", "two-phase"]


def test_drafting_steps_set_what_was_expected_against_what_they_gave() -> None:
    """``drafting_gains``: each one-phase drafting step's expected gain (the planner's field)
    against its emitted tokens a ms over the same run's plain rate at the nearest row count;
    priced over measured ms of both. Admitting, two-phase and plain steps are not counted,
    nor a step with no plain step within 2 rows, nor an older entry without the fields."""
    plain = [4, 0, 0, 2.0, 0.0, 0.0, 4, 4, 0, 0, 0.0, 0.0, 0.0]  # 2 tokens a ms
    steps = [
        plain,
        [4, 0, 0, 4.0, 0.0, 0.0, 4, 4, 0, 0, 0.0, 0.0, 0.0],  # median of 2 and 4: 4 (upper)
        [5, 7, 0, 5.0, 0.0, 0.0, 40, 15, 0, 7, 1.2, 2.2, 4.5],  # 3 a ms over 5 / 4: 2.4x
        [3, 7, 0, 4.0, 0.0, 0.0, 24, 6, 0, 7, 1.1, 2.2, 4.0],  # 1.5 a ms over 3 / 4: 2.0x
        [40, 7, 0, 4.0, 0.0, 0.0, 24, 6, 0, 7, 1.1, 2.2, 4.0],  # no plain step near 40 rows
        [4, 7, 1, 9.0, 0.0, 0.0, 32, 9, 0, 7, 1.1, 2.2, 4.0],  # admitting
        [4, 7, 0, 9.0, 0.0, 1.0, 32, 9, 1, 7, 1.1, 2.2, 4.0],  # two-phase
        [4, 7, 0, 3.0, 0.0, 0.0, 24, 6],  # before session 43: no planner fields
    ]
    call = {
        "phases": [{"name": "busy", "concurrency": 8}],
        "runs": [{"policy": "a", "phases": {"busy": {"timeline": steps}}}],
    }
    (cell,) = summarise([call])["busy"]["policies"]["a"]["drafting_gains"]
    assert cell["rows"] == "1-8" and cell["steps"] == 2
    assert cell["expected_gain"] == pytest.approx(1.15)
    assert cell["realized_gain"] == pytest.approx((2.4 + 2.0) / 2)
    assert cell["draft_priced_over_measured"] == pytest.approx((4.5 / 5 + 4.0 / 4) / 2)
    assert cell["plain_priced_over_measured"] == pytest.approx(2.2 / 4)
    no_planner = {"runs": [{"policy": "b", "phases": {"busy": {"timeline": [plain]}}}]}
    assert "drafting_gains" not in summarise([no_planner])["busy"]["policies"]["b"]


def test_the_drain_is_what_follows_each_runs_last_full_batch_step() -> None:
    """``drain``: per run, the steps after its last step at the phase's concurrency (a run
    that never filled the batch is left out), their seconds, drafting and one-row steps."""
    full = [4, 7, 0, 10.0, 0.0, 0.0, 32, 20]
    first = [full, [3, 7, 0, 8.0, 0.0, 0.0, 24, 12], full, [2, 0, 0, 4.0, 0.0, 0.0, 2, 2]]
    first += [[1, 0, 0, 3.0, 0.0, 0.0, 1, 1], [1, 7, 0, 5.0, 0.0, 0.0, 8, 3]]
    second = [full, [1, 0, 0, 3.0, 0.0, 0.0, 1, 1]]
    never = [[3, 7, 0, 8.0, 0.0, 0.0, 24, 12]]
    call = {
        "phases": [{"name": "busy", "concurrency": 4}],
        "runs": [
            {"policy": "a", "phases": {"busy": {"timeline": t}}} for t in (first, second, never)
        ],
    }
    info = summarise([call])["busy"]["policies"]["a"]
    assert info["drain"] == {
        "runs": 2,
        "steps_per_run": 2.0,
        "s_per_run": round((12.0 + 3.0) / 2 / 1e3, 4),
        "drafting_steps_per_run": 0.5,
        "one_row_steps_per_run": 1.5,
    }
    call["runs"] = [{"policy": "a", "phases": {"busy": {"timeline": never}}}]
    assert "drain" not in summarise([call])["busy"]["policies"]["a"]


def test_cli_reads_gzip_writes_json_and_refuses_a_merged_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tmp_path / "call.json.gz"
    with gzip.open(raw, "wt") as handle:
        json.dump(_call(), handle)
    out = tmp_path / "summary.json"
    assert main([str(raw), "--out", str(out), "--min-steps", "1"]) == 0
    assert "== busy (concurrency 4)" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["phases"]["busy"]["policies"]["b"]["runs"] == 1
    assert "--min-steps 1" in record["command"]
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps({"arms": {}}))
    assert main([str(merged)]) == 2
    assert "not a raw gpu_decisions call" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.json")]) == 2


def test_plain_stretches_of_the_batch_are_reported_with_the_decision() -> None:
    """Runs of k = 0 at half the concurrency or more, 16 steps or longer, with the planner's
    decision at their ends when the entries carry it, and what drafting emitted around them."""
    from bench.step_timeline import plain_stretches

    def entry(k: int, rows: int = 4, emitted: int = 4, gain: float = 0.0) -> list[float]:
        decision = [7, gain, 1.0, 2.0]
        return [rows, k, 0, 2.0 if k else 1.0, 0.0, 0.0, rows * (k + 1), emitted, 0, *decision]

    timeline = (
        [entry(7, emitted=12)] * 8
        + [entry(0, gain=0.97)] + [entry(0, gain=0.99)] * 19  # 20 plain steps at 4 rows
        + [entry(7, emitted=16)] * 8
        + [entry(0)] * 10  # too short
        + [entry(0, rows=1, emitted=1)] * 30  # too few rows (the phase's tail)
    )  # fmt: skip
    (stretch,) = plain_stretches(timeline, full=4)
    assert (stretch["start"], stretch["steps"], stretch["rows"]) == (8, 20, 4)
    assert stretch["before_emitted_per_ms"] == pytest.approx(6.0)
    assert stretch["during_emitted_per_ms"] == pytest.approx(4.0)
    assert stretch["after_emitted_per_ms"] == pytest.approx(8.0)
    assert stretch["decision_first"] == [7, 0.97, 1.0, 2.0]
    assert stretch["decision_last"] == [7, 0.99, 1.0, 2.0]
    old = [e[:9] for e in timeline]  # before session 43: no decision fields
    assert "decision_first" not in plain_stretches(old, full=4)[0]
    summary = summarise(
        [
            {
                "phases": [{"name": "p", "concurrency": 4}],
                "runs": [{"policy": "g", "phases": {"p": {"timeline": timeline}}}],
            }
        ]
    )
    assert summary["p"]["policies"]["g"]["plain_stretches"][0]["run"] == 0
