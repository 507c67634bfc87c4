"""bench/plain_step_host_ab.py: two trees' plain-step host time, alternating, every run kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.plain_step_host_ab import main

ROOT = Path(__file__).resolve().parents[2]


def test_two_trees_alternate_and_every_run_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    trees = ["--tree", f"a={ROOT}", "--tree", f"b={ROOT}"]
    assert (
        main([*trees, "--repeats", "2", "--rounds", "1", "--tokens", "4", "--out", str(out)]) == 0
    )
    report = json.loads(out.read_text())
    assert sorted(report["order"]) == ["a", "a", "b", "b"]
    for name in ("a", "b"):
        cell = report["fast_median_us"][name]
        assert len(cell["runs"]) == 2 and cell["min"] <= cell["median"] <= cell["max"]


def test_one_tree_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--tree", f"a={ROOT}", "--out", str(tmp_path / "ab.json")])
