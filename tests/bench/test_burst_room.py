"""bench/burst_room.py: the engine's own burst rule in a closed-loop model; cuts lengthen
wide batches' bursts and the default share is restored after."""

from __future__ import annotations

import json
from pathlib import Path

from bench.burst_room import main
from engines.embedded.engine import Engine


def test_cuts_lengthen_the_bursts_of_a_wide_batch(tmp_path: Path) -> None:
    out = tmp_path / "burst.json"
    before = Engine.burst_cut_share
    assert (
        main(["--out", str(out), "--cases", "1:15,16:7", "--shares", "0,0.125", "--steps", "600"])
        == 0
    )
    assert Engine.burst_cut_share == before
    cases = json.loads(out.read_text())["cases"]
    wide = cases["16x7"]
    assert wide["0.0"]["drafted_cut"] == 0.0
    assert wide["0.125"]["mean_burst"] > wide["0.0"]["mean_burst"] + 0.5
    assert 0 < wide["0.125"]["drafted_cut"] <= 0.125
    lone = cases["1x15"]
    assert lone["0.125"]["drafted_cut"] < 0.02  # a lone row near its end steps singly
    assert all(1 <= v["mean_burst"] <= 4 for case in cases.values() for v in case.values())


def test_unseen_ends_run_full_bursts_with_scratch_steps(tmp_path: Path) -> None:
    """Ends the engine cannot see: every burst runs in full, a share of row-steps falls after
    a row's end (none with ends it sees), and the net against single steps is the time a
    burst saves less that share."""
    results = {}
    for ends in ("length", "unseen"):
        out = tmp_path / f"{ends}.json"
        argv = ["--out", str(out), "--cases", "1:15,16:7", "--shares", "0.125", "--steps", "600"]
        assert main([*argv, "--ends", ends, "--overheads", "0,0.1"]) == 0
        results[ends] = json.loads(out.read_text())
    assert results["unseen"]["ends"] == "unseen"
    for case in ("1x15", "16x7"):
        seen = results["length"]["cases"][case]["0.125"]
        unseen = results["unseen"]["cases"][case]["0.125"]
        assert seen["scratch_row_steps"] == 0.0 and 0 < unseen["scratch_row_steps"] < 0.1
        assert unseen["mean_burst"] == 4.0 and unseen["drafted_cut"] == 0.0
        net = unseen["net_at_overhead"]
        assert net["0.0"] == 1.0 - unseen["scratch_row_steps"]  # nothing to save: only waste
        assert net["0.1"] == (1.0 - unseen["scratch_row_steps"]) / (1.0 - 0.1 + 0.1 / 4)
