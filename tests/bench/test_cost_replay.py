"""bench/cost_replay.py: a harness call's decode steps replayed into goodput's cost model."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.cost_replay import main

TABLE_MS = {  # rows -> verify width -> ms (whole steps, as the engine profiles them)
    str(b): {str(w): (1.0 + 0.02 * b) * (1.0 if w == 1 else 2.0 + 0.1 * w) for w in (1, 8, 16)}
    for b in (1, 32, 64)
}


def _raw(tmp_path: Path) -> Path:
    """A call whose goodput ran k = 7 only, at 40-64 rows that cost the same (no plain step at
    the row of 64), and a no-spec run whose plain 64-row steps took 2.5 ms."""
    goodput = [[rows, 7, 0, 6.2, 0, 0, rows * 8, rows * 3] for rows in (40, 48, 56, 64) * 30]
    plain = [[64, 0, 0, 2.5, 0, 0, 64, 64]] * 20 + [[64, 0, 1, 30.0, 0, 0, 64, 64]]
    runs = [
        {
            "policy": "goodput",
            "repeat": 0,
            "phases": {
                "math": {"timeline": []},
                "mixed": {"timeline": goodput},
                "chat": {"timeline": []},
            },
        },
        {"policy": "no-spec", "repeat": 0, "phases": {"mixed": {"timeline": plain}}},
    ]
    rates = {"math": [0.9] * 15, "chat": [0.5] * 15}
    info = {"cost_table_ms": TABLE_MS, "block_size": 16, "global_rates": rates}
    phases = [{"name": "mixed", "mix": {"math": 0.5, "chat": 0.5}}]
    raw = {"arm_info": info, "phases": phases, "runs": runs}
    path = tmp_path / "call.json.gz"
    path.write_bytes(gzip.compress(json.dumps(raw).encode()))
    return path


def test_a_row_that_ran_one_width_prices_plain_by_the_tables_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "replay.json"
    main([str(_raw(tmp_path)), "--batch", "64", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report == json.loads(capsys.readouterr().out)
    assert report["measured_ms_by_k"] == {"0": 2.5}  # the admitting call left out
    last = report["replay"][-1]
    assert [r["phase"] for r in report["replay"]] == ["math", "mixed", "chat"]
    assert last["steps"] == 0 and report["replay"][1]["steps"] == 120
    assert last["row"] == 64 and last["row_widths_seen"] == 1 and last["row_overhead_ms"] == 0
    table, priced = report["table_ms"], last["priced_ms"]
    assert last["priced_k7_over_plain"] == pytest.approx(table["7"] / table["0"], rel=1e-3)
    # (the row's ratio is over 1: above the engine's profile, which floors the plain price)
    assert priced["0"] > table["0"]
    # before anything is learnt: a shared k for the mixed phase's rows at 32, 48 and 64
    prices = report["shared_k_prices"]
    assert set(prices) == {"32xmixed", "48xmixed", "64xmixed"}
    for each in prices.values():
        gains = {int(k): v for k, v in each["gain_over_plain"].items()}
        assert gains[0] == pytest.approx(1.0) and each["best_k"] == max(
            gains, key=gains.__getitem__
        )
        assert each["best_k"] in (0, 7, 15)  # a padded arm: k's of one width cost the same


def test_a_policy_the_file_lacks_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no runs of policy 'oracle' \\(has goodput, no-spec\\)"):
        main([str(_raw(tmp_path)), "--policy", "oracle"])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.json.gz")])


def test_the_measured_steps_of_a_gpu_call_price_the_plain_step_near_its_measured_time() -> None:
    """Session 37's eager 8B call (H100, committed raw file), goodput's steps replayed: the
    row of 64 ran k = 7 only, the row of 1 ran k = 14 and 15 (with every k a width of its own,
    two widths of about one cost) and a few others. Neither may separate an overhead: fitted
    there, they priced the plain step they had barely run at 13.5-14.4 ms (measured 9.8) and
    7.1-7.4 ms (measured 6.8)."""
    from bench.cost_replay import measured_ms, replay

    path = Path(__file__).resolve().parents[2] / "bench/results/gpu_decisions"
    raw = json.loads(gzip.decompress((path / "synthetic-8b_2026-12-05s37d.json.gz").read_bytes()))
    for batch in (1, 64):
        plain = measured_ms(raw, batch)["0"]
        fitted = [p for p in replay(raw, "goodput", batch) if p["row_widths_seen"]]
        assert len(fitted) >= 4  # (batch 64: from the first mixed phase on)
        for phase in fitted:
            assert phase["row_overhead_ms"] == 0.0
            assert phase["priced_ms"]["0"] == pytest.approx(plain, rel=0.06)


def test_a_two_phase_step_that_verified_nothing_is_replayed_as_a_drafting_step(
    tmp_path: Path,
) -> None:
    """Session 42: the timeline's widest verified k is 0 for a two-phase step whose allocator
    verified nothing, though the draft ran (4.3-4.5 ms at 64 rows on the real pair, plain
    1.5); its ninth field says two-phase, and the replay prices it as drafting, not plain."""
    raw = json.loads(gzip.decompress(_raw(tmp_path).read_bytes()))
    two_phase = [[64, 0, 0, 9.0, 0, 0, 64, 64, 1]] * 30
    raw["runs"][0]["phases"]["math"]["timeline"] = two_phase
    path = tmp_path / "two_phase.json.gz"
    path.write_bytes(gzip.compress(json.dumps(raw).encode()))
    out = tmp_path / "replay.json"
    main([str(path), "--batch", "64", "--out", str(out)])
    report = json.loads(out.read_text())
    first = report["replay"][0]  # after the math phase: the 30 two-phase steps only
    assert first["steps"] == 30
    priced, table = first["priced_ms"], report["table_ms"]
    # the row's ratio (from the drafting steps) prices plain as it prices k = 7; taken for
    # plain steps, they would have priced plain at their own 9 ms (3.9x its table)
    assert priced["0"] / table["0"] == pytest.approx(priced["7"] / table["7"], rel=0.01)
    assert priced["0"] < 0.4 * 9.0
