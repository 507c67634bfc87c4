"""bench/first_start.py on the CPU: fresh processes on fresh compile cache folders, in a random
order over the trees, a restart on the first start's folder, and the summary the GPU call
reads (tiny shape, no compile: what the CPU can run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.first_start import ROOT, main, parse_args, summarise


def test_first_starts_and_restarts_of_two_trees_are_summarised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "first_start.json"
    argv = ["--device", "cpu", "--tiny", "--no-compile", "--attention", "sdpa", "--batches", "4"]
    trees = ["--tree", f"a={ROOT}", "--tree", f"b={ROOT}"]  # the same code twice: an A/A
    trees += ["--args", "b=--compile-ahead"]  # b's starts only (a no-op with sdpa)
    assert main([*argv, *trees, "--repeats", "1", "--restart", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["tree_arguments"] == {"b": ["--compile-ahead"]}
    assert all(run["attention_compiled_ahead"] == 0 for run in result["runs"])  # sdpa
    assert sorted(result["order"]) == ["a#0", "b#0"]
    kinds = [(r["tree"], r["kind"]) for r in result["runs"]]
    assert sorted(kinds) == [("a", "first"), ("a", "restart"), ("b", "first"), ("b", "restart")]
    for run in result["runs"]:
        assert run["start_s"] == pytest.approx(sum(run["capture_s"].values()), abs=0.02)
        assert run["wall_s"] > run["start_s"] >= 0  # CPU, no compile: captures take ~0 s
        assert run["num_graphs"]["ragged"] > 0 and run["device"] == "cpu"
    summary = result["summary"]
    assert set(summary) == {"a", "b"} and set(summary["a"]) == {"first", "restart"}
    assert summary["a"]["first"]["start_s"]["n"] == 1
    assert "first:" in capsys.readouterr().err  # progress, one line per start


def test_summary_gives_the_spread_per_tree_and_kind() -> None:
    runs = [
        {"tree": "new", "kind": "first", "start_s": s, "wall_s": s + 5, "graphs_compiled": 8}
        for s in (62.2, 75.5)
    ]
    got = summarise(runs)["new"]["first"]
    assert got["start_s"] == {"mean": 68.85, "sd": 9.4, "min": 62.2, "max": 75.5, "n": 2}
    assert got["graphs_compiled"] == [8]


def test_bad_trees_are_refused_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--tree", "nopath"])
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--tree", f"a={tmp_path}"])  # no bench/ragged_gpu_check.py
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--tree", f"a={ROOT}", "--tree", f"a={ROOT}"])
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--repeats", "0"])
    args = parse_args(["--out", "x", "--", "--context-len", "48"])
    assert args.tree == [("this", ROOT)] and args.extra == ["--context-len", "48"]


def test_a_failed_start_is_recorded_and_the_rest_still_run(tmp_path: Path) -> None:
    out = tmp_path / "first_start.json"
    argv = ["--device", "cpu", "--tiny", "--no-compile", "--attention", "sdpa", "--batches", "4"]
    # an argument the check refuses: every start fails, each is recorded, nothing is lost
    code = main([*argv, "--repeats", "2", "--restart", "--out", str(out), "--", "--bogus"])
    assert code == 1
    result = json.loads(out.read_text())
    assert result["runs"] == [] and len(result["failed"]) == 2
    assert all("--bogus" in error for error in result["errors"])


def test_a_start_that_would_not_fit_in_the_budget_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--budget-s`` bounds when the call ends: a start is begun only if the longest so far
    still fits in what is left (session 19 lost a start, and its call's last minutes, to a
    bound on when a start began)."""
    import time

    import bench.first_start as first_start

    def fake(tree: Path, cache: Path, check_args: list[str], timeout_s: float) -> dict[str, object]:
        time.sleep(0.3)
        return {"start_s": 0.3, "wall_s": 0.3, "graphs_compiled": 0}

    monkeypatch.setattr(first_start, "start", fake)
    out = tmp_path / "budget.json"
    argv = ["--device", "cpu", "--tiny", "--no-compile", "--attention", "sdpa"]
    assert main([*argv, "--repeats", "4", "--budget-s", "0.75", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 2 and len(result["skipped"]) == 2


def test_extra_arguments_must_name_a_tree(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args(
        ["--out", "x", "--tree", f"s={ROOT}", "--args", "s=--a --b=1", "--args", "s=-c"]
    )
    assert args.tree_args == {"s": ["--a", "--b=1", "-c"]}
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--args", "other=--compile-ahead"])
    assert "NAME one of the trees ['this']" in capsys.readouterr().err
