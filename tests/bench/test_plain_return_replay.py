"""bench/plain_return_replay.py: the batch planner replayed on recorded batch-1 requests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.plain_return_replay import main, recorded_requests, static, step_table, study

# Per k = 0, 3, 7, 11, 15: what the goodput runs priced a batch-1 step at (ms).
STEP_MS = {"0": 1.0, "3": 2.0, "7": 2.0, "11": 2.0, "15": 2.0}
RATES = [0.6] * 15


def _step(k: int, admitted: bool, emitted: int) -> list[float]:
    return [1, k, int(admitted), 1.0, 0.0, 0.0, k + 1, emitted, 0]


def _timeline(k: int) -> list[list[float]]:
    """Two requests at k: a hard opening (1 token a step for 30 steps) then easy text (k + 1
    a step for 60 steps), and one easy request."""
    steps = []
    for index in range(2):
        steps += [_step(k, step == 0, 1) for step in range(30)] if index == 0 else []
        steps += [_step(k, index == 1 and step == 0, k + 1) for step in range(60)]
    return steps


def _results(tmp_path: Path) -> Path:
    view = {"step_ms": STEP_MS, "tasks": {t: {"rates": RATES} for t in ("math", "code", "chat")}}
    runs = [
        {
            "policy": "static-k7",
            "repeat": 0,
            "phases": {"math": {"timeline": _timeline(7), "tok_s": 1.0}},
        },
        {"policy": "no-spec", "repeat": 0, "phases": {"math": {"timeline": [], "tok_s": 1.0}}},
        {
            "policy": "goodput",
            "repeat": 0,
            "phases": {"math": {"planner_view": view, "tok_s": 1.0}},
        },
    ]
    path = tmp_path / "real-pair.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"runs": runs}, handle)
    return path


def test_recorded_requests_and_static_k_reproduce_the_recording(tmp_path: Path) -> None:
    """The requests are the static run's, and that k replayed on them takes its steps."""
    report = json.load(gzip.open(_results(tmp_path), "rt"))
    requests = recorded_requests(report["runs"][0], "math")
    assert [r.tokens for r in requests] == [30 + 60 * 8, 60 * 8]
    assert requests[0].potential[:31] == [1] * 30 + [8]  # the opening, then a step's 8 ...
    assert requests[0].potential[31:38] == [7, 6, 5, 4, 3, 2, 1]  # ... and the rest of its run
    table = step_table({1: 1e-3, 4: 2e-3, 8: 2e-3, 16: 2e-3})
    assert static(requests, table, 7) == pytest.approx((30 + 60 + 60) * 2e-3)
    assert static(requests, table, 0) == pytest.approx(sum(r.tokens for r in requests) * 1e-3)
    assert step_table({1: 1.0, 8: 8.0}).time_s(1, 4) == pytest.approx(4.0)  # linear between


def test_a_request_whose_hard_opening_ends_drafts_again_sooner_with_fewer_steps_an_entry(
    tmp_path: Path,
) -> None:
    """The replay shows the fault it studies: with 8 plain steps a window entry the first
    request stays plain through most of its easy text, with 1 it drafts again soon."""
    result = study(
        _results(tmp_path),
        {"R1": {"request_plain_entry_steps": 1}, "R8": {"request_plain_entry_steps": 8}},
        "math",
        seeds=1,
    )
    replayed = result["replayed"]
    assert replayed["R1"]["drafted_share"] > replayed["R8"]["drafted_share"]
    assert replayed["R1"]["tok_s"] > replayed["R8"]["tok_s"]
    assert result["truth"] == "static-k7" and result["requests"] == 2


def test_the_command_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    assert (
        main(
            [
                str(_results(tmp_path)),
                "--variant",
                "R2:request_plain_entry_steps=2",
                "--seeds",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    (entry,) = report["files"].values()
    assert set(entry["replayed"]) == {"no-spec", "static-k7", "shipped", "R2"}


def test_a_file_without_the_runs_it_needs_is_named(tmp_path: Path) -> None:
    path = tmp_path / "no-goodput.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"runs": [{"policy": "static-k7", "repeat": 0, "phases": {}}]}, handle)
    with pytest.raises(SystemExit, match="needs a static-k<N> run and a goodput run"):
        main([str(path)])
