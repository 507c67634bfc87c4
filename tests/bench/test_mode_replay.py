"""bench/mode_replay.py: a policy's recorded steps through the step-mode chooser, with the
admissions' prefill timed into the call before each admission (as before session 54) or not,
and with the plain steps left out (session 56)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.mode_replay import calls_of, main, replay
from policies.step_mode import ModeSettings

# timeline entries: rows, kmax, admitted, ms, wait_ms, alloc_ms, verified, emitted, two-phase
PLAIN = [64, 0, 0, 1.0, 0.0, 0.0, 64, 64, 0]
ADMIT = [64, 0, 1, 3.0, 0.0, 0.0, 64, 64, 0]  # 4 steps: 8 ms of prefill on 4 ms of steps
TWO = [64, 3, 0, 2.0, 0.0, 0.5, 128, 64, 1]


def _timeline() -> list[list[float]]:
    """Plain bursts of 4 (an admission into every other one), then two-phase calls of 4 each
    time the batch drafts: one phase emits 64 tokens a ms, two phases 32."""
    steps: list[list[float]] = []
    for block in range(12):
        for call in range(2):
            ms = 1.0 + 0.001 * (2 * block + call)  # (calls of one time: one call)
            steps += [[*PLAIN[:3], ms, *PLAIN[4:]]] * 4
        steps += [ADMIT] * 4 if block % 2 else []
        steps += [[*TWO[:3], 2.0 + 0.001 * block, *TWO[4:]]] * 8
    return steps


def test_calls_are_the_runs_of_steps_of_one_time_and_one_admission_flag() -> None:
    calls = calls_of(_timeline()[:12])
    assert [(rows, two, adm, len(emitted), k) for rows, two, adm, emitted, _, k in calls] == [
        (64, False, False, 4, 0),
        (64, False, False, 4, 0),
        (64, True, False, 4, 3),
    ]


def test_the_prefill_moved_onto_the_call_before_slows_that_calls_mode_only_when_blind() -> None:
    """Admissions follow one-phase calls here: blind, their prefill slows one phase (pooled,
    and in the 8-step blocks paired with two phases); told, both modes read their own rates."""
    result = replay([_timeline()], 32, ModeSettings())
    (blind,), (told,) = result["blind"], result["told"]
    assert told["one_phase_tok_s"] == pytest.approx(64_000, rel=0.03)
    assert blind["one_phase_tok_s"] < 0.8 * told["one_phase_tok_s"]
    assert blind["two_phase_tok_s"] == told["two_phase_tok_s"] == pytest.approx(32_000, rel=0.03)
    assert told["paired_ratio"] == pytest.approx(0.5, rel=0.04)
    assert blind["paired_ratio"] > 1.3 * told["paired_ratio"]


def test_main_writes_both_ways_per_call(tmp_path: Path) -> None:
    raw = tmp_path / "call.json"
    run = {"policy": "goodput", "repeat": 0, "phases": {"mixed": {"timeline": _timeline()}}}
    raw.write_text(json.dumps({"runs": [run]}))
    out = tmp_path / "replay.json"
    assert main([str(raw), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["calls"]["call.json"]) == {"blind", "told", "drafting"}
    with pytest.raises(SystemExit, match="no runs of policy"):
        main([str(raw), "--policy", "vllm-av"])


ONE = [64, 5, 0, 3.0, 0.0, 0.0, 384, 96, 0]  # one-phase drafting: 32 tokens a ms


def test_drafting_leaves_the_plain_steps_out_of_both_modes() -> None:
    """Plain blocks (64 tokens a ms) beside two-phase ones (32) make two phases look half as
    fast when the plain steps count as one phase; left out, two phases are paired with the
    one-phase drafting steps around them (32 a ms too here) and come out level."""
    steps: list[list[float]] = []
    for block in range(12):
        steps += [[*PLAIN[:3], 1.0 + 0.001 * block, *PLAIN[4:]]] * 8
        steps += [[*ONE[:3], 3.0 + 0.001 * block, *ONE[4:]]] * 8
        steps += [[*TWO[:3], 2.0 + 0.001 * block, *TWO[4:]]] * 8
    result = replay([steps], 32, ModeSettings())
    (told,), (drafting,) = result["told"], result["drafting"]
    assert told["one_phase_tok_s"] > 1.15 * drafting["one_phase_tok_s"]
    assert drafting["one_phase_tok_s"] == pytest.approx(32_000, rel=0.03)
    assert drafting["paired_ratio"] == pytest.approx(1.0, rel=0.04)
    assert told["paired_ratio"] < 0.8


def test_main_replays_the_warm_pass_first_when_asked(tmp_path: Path) -> None:
    raw = tmp_path / "call.json"
    run = {"policy": "goodput", "repeat": 0, "phases": {"mixed": {"timeline": _timeline()}}}
    raw.write_text(json.dumps({"runs": [run], "warm_runs": {"goodput": run}}))
    out, warm = tmp_path / "replay.json", tmp_path / "warm.json"
    assert main([str(raw), "--json", str(out)]) == 0
    assert main([str(raw), "--with-warm", "--json", str(warm)]) == 0
    pairs = [
        json.loads(p.read_text())["calls"]["call.json"]["told"][0]["pairs"] for p in (out, warm)
    ]
    assert pairs[1] > pairs[0]


def test_live_replays_the_steps_as_the_chooser_was_told_them(tmp_path: Path) -> None:
    """With ``mode_told`` in the raw file the ``live`` way feeds a chooser exactly those steps:
    here told twice as slow for two phases as the harness timed them, so its paired estimate
    is half the ``drafting`` way's; without ``mode_told`` (older calls) there is no ``live``."""
    steps: list[list[float]] = []
    told: list[list[float]] = []
    for block in range(12):
        steps += [[*ONE[:3], 3.0 + 0.001 * block, *ONE[4:]]] * 8
        steps += [[*TWO[:3], 2.0 + 0.001 * block, *TWO[4:]]] * 8
        told += [[64, False, 96, 3.0]] * 8 + [[64, True, 64, 4.0]] * 8
    result = replay([steps], 32, ModeSettings(), [told])
    (drafting,), (live,) = result["drafting"], result["live"]
    assert live["paired_ratio"] == pytest.approx(0.5 * drafting["paired_ratio"], rel=0.05)
    raw = tmp_path / "call.json"
    phases = {"mixed": {"timeline": steps, "mode_told": told}}
    raw.write_text(json.dumps({"runs": [{"policy": "goodput", "repeat": 0, "phases": phases}]}))
    out = tmp_path / "replay.json"
    assert main([str(raw), "--json", str(out)]) == 0
    assert "live" in json.loads(out.read_text())["calls"]["call.json"]
    assert "live" not in replay([steps], 32, ModeSettings())
