"""bench/plain_step_host.py: both variants measured in the seeded order, the JSON written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.plain_step_host import main


def test_both_variants_are_timed_and_written(tmp_path: Path) -> None:
    out = tmp_path / "plain.json"
    assert main(["--rounds", "2", "--tokens", "6", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert sorted(result["order"]) == ["fast", "fast", "general", "general"]
    summary = result["summary"]
    for name in ("fast", "general"):
        assert len(summary[name]["rounds_us"]) == 2
        assert 0 < summary[name]["min_us"] <= summary[name]["median_us"] <= summary[name]["max_us"]
    assert summary["fast_over_general_median"] > 0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--rounds", "0", "--out", "x"])


def test_bursts_are_compared_with_single_steps(tmp_path: Path) -> None:
    """--burst 4: the fast path one step a call against plain bursts of 4, timed per step."""
    out = tmp_path / "burst.json"
    assert main(["--rounds", "2", "--tokens", "9", "--burst", "4", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["burst"] == 4 and sorted(result["order"]) == ["burst", "burst", "fast", "fast"]
    assert result["summary"]["fast_over_burst_median"] > 0
    with pytest.raises(SystemExit):
        main(["--burst", "17", "--out", str(out)])
