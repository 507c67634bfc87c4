"""bench/loop_handover.py: both ways of handing events to an event loop timed in the seeded
order, every event delivered, the JSON written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.loop_handover import main


def test_both_ways_are_timed_and_written(tmp_path: Path) -> None:
    out = tmp_path / "h.json"
    assert main(["--rows", "8", "--steps", "20", "--rounds", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert sorted(result["order"]) == ["per_event", "per_event", "per_step", "per_step"]
    for name in ("per_event", "per_step"):
        rounds = result["summary"][name]["rounds_us_per_event"]
        assert len(rounds) == 2 and all(v > 0 for v in rounds)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--rows", "0", "--out", str(tmp_path / "h.json")])
