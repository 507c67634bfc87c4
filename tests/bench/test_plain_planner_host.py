"""bench/plain_planner_host.py: no planner and the goodput planner timed on whole plain bursts
in the seeded order, the critical path split from the overlap, the JSON written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.plain_planner_host import main


def test_both_variants_are_timed_on_plain_bursts_and_written(tmp_path: Path) -> None:
    out = tmp_path / "planner.json"
    assert main(["--rounds", "2", "--tokens", "24", "--batch", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert sorted(result["order"]) == ["goodput", "goodput", "no-spec", "no-spec"]
    for name in ("no-spec", "goodput"):
        rounds = result["rounds"][name]
        assert len(rounds) == 2 and all(r["calls"] >= 1 for r in rounds)
        summary = result["summary"][name]
        assert 0 < summary["critical_us"] <= summary["total_us"]
        low, high = summary["critical_us_range"]
        assert low <= summary["critical_us"] <= high
    # the planner's record and next decision run in the overlap; no planner, little there
    summary = result["summary"]
    assert summary["goodput"]["overlap_us"] > summary["no-spec"]["overlap_us"]
    extra = summary["goodput"]["critical_us"] - summary["no-spec"]["critical_us"]
    assert summary["goodput_critical_extra_us"] == pytest.approx(extra, abs=0.01)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--rounds", "0", "--out", "x"])
    with pytest.raises(SystemExit):
        main(["--burst", "4", "--tokens", "7", "--out", "x"])


def test_chained_variants_run_chains_and_are_compared(tmp_path: Path) -> None:
    """``--chain``: both policies again with chained plain bursts, in the same shuffled
    order; what chaining saves each, and goodput's extra with it, in the summary."""
    out = tmp_path / "chain.json"
    argv = ["--rounds", "1", "--tokens", "32", "--chain", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    names = ["goodput", "goodput-chain", "no-spec", "no-spec-chain"]
    assert sorted(result["order"]) == names
    summary = result["summary"]
    for name in names:
        assert result["rounds"][name][0]["calls"] >= 1
    saved = summary["no-spec"]["total_us"] - summary["no-spec-chain"]["total_us"]
    assert summary["no-spec_chain_saves_us"] == pytest.approx(saved, abs=0.01)
    extra = summary["goodput-chain"]["total_us"] - summary["no-spec-chain"]["total_us"]
    assert summary["goodput_chain_total_extra_us"] == pytest.approx(extra, abs=0.01)
    # every round's tokens checksummed (with the forward taken out every token is the same;
    # the device run is where chained and unchained rounds could disagree)
    assert summary["tokens_agree"] is True
    every = [r for rs in result["rounds"].values() for r in rs]
    assert all(isinstance(r["tokens_crc"], int) for r in every)
    # rounds whose planner drafted are left out of the check (other verify shapes' numerics)
    assert all(isinstance(r["drafting_steps"], int) for r in every)
    plain = sum(1 for r in every if r["drafting_steps"] == 0)
    assert summary["tokens_agree_rounds"] == plain >= 2  # the no-spec rounds at least
