"""Acceptance traces: exact replay at full block, the hard-token model below it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from policies.types import Task
from sim.scenario import ParametricTask
from sim.traces import load_traces, parametric_trace, trace_from_accept_lengths

REPO = Path(__file__).resolve().parents[2]


def _replay(trace: object, k: int) -> list[int]:
    from sim.traces import AcceptanceTrace

    assert isinstance(trace, AcceptanceTrace)
    lengths, position, hint = [], 0, 0
    while position < trace.num_output_tokens:
        accepted, hint = trace.accepted_at(position, k, hint)
        lengths.append(accepted + 1)
        position += accepted + 1
    return lengths


def test_full_block_replay_reproduces_the_recording() -> None:
    recorded = [7, 3, 16, 1, 16, 5]
    trace = trace_from_accept_lengths(recorded, block_size=16)
    assert trace.num_output_tokens == sum(recorded)
    assert _replay(trace, 15) == recorded


def test_smaller_k_truncates_and_fails_again_on_the_hard_token() -> None:
    trace = trace_from_accept_lengths([7, 3], block_size=16)  # hard tokens at 6 and 9
    assert trace.hard_positions == (6, 9)
    # k = 4 from 0: 4 accepted (positions 0-3), bonus 4; from 5: one accepted, fails on 6.
    assert _replay(trace, 4) == [5, 2, 3]
    assert _replay(trace, 0) == [1] * 10


def test_parametric_trace_matches_its_rates() -> None:
    model = ParametricTask(first_rate=0.8, last_rate=0.8, request_spread=0.0)
    rng = random.Random(0)
    lengths: list[int] = []
    for _ in range(200):
        lengths += _replay(parametric_trace(model, 16, 400, rng), 15)[:-1]
    expected = 1 + sum(0.8**i for i in range(1, 16))
    assert sum(lengths) / len(lengths) == pytest.approx(expected, rel=0.05)


def test_trace_files_load_and_bad_lines_name_file_and_line(tmp_path: Path) -> None:
    good = {"task": "math", "block_size": 16, "prompt_tokens": 50, "accept_lengths": [4, 16, 2]}
    (tmp_path / "a.jsonl").write_text(json.dumps(good) + "\n")
    traces = load_traces(tmp_path, 16)
    assert traces[Task.MATH][0].trace.num_output_tokens == 22
    (tmp_path / "b.jsonl").write_text(json.dumps({**good, "accept_lengths": [17]}) + "\n")
    with pytest.raises(ValueError, match=r"b\.jsonl:1: bad trace line"):
        load_traces(tmp_path, 16)


@pytest.mark.parametrize("k", [1, 2, 4, 5, 6, 7])
def test_first_step_at_smaller_k_accepts_min_of_recorded_drafts_and_k(k: int) -> None:
    # A step recorded at full block (k = 7) with accept length L accepted L - 1 drafts (the
    # bonus is the +1). From the same position, k drafts accept min(L - 1, k), plus the bonus.
    for recorded in (1, 2, 4, 7, 8):
        trace = trace_from_accept_lengths([recorded, 8, 8], block_size=8)
        accepted, _ = trace.accepted_at(0, k)
        assert accepted == min(recorded - 1, k)
        assert _replay(trace, k)[0] == min(recorded - 1, k) + 1


def test_replay_below_full_block_keeps_positions_not_steps() -> None:
    # Recorded [8, 3]: seven drafts then a bonus (no hard token), then two accepted and a
    # miss at output position 10. k = 4 cuts the first run at 5 tokens; the next step starts
    # at position 5 (not at a fresh recorded step) and runs into the hard token at 10.
    trace = trace_from_accept_lengths([8, 3], block_size=8)
    assert trace.hard_positions == (10,)
    assert _replay(trace, 4) == [5, 5, 1]
    assert sum(_replay(trace, 4)) == sum(_replay(trace, 7)) == trace.num_output_tokens == 11
    # No drafting: one token per step, the same output.
    assert _replay(trace, 0) == [1] * 11


def test_recorded_traces_replay_exactly_at_full_block() -> None:
    traces = load_traces(REPO / "traces" / "demo_b8_embedded.jsonl", 8)
    assert {task: len(records) for task, records in traces.items()} == {
        Task.MATH: 40,
        Task.CODE: 40,
        Task.CHAT: 40,
    }
    lines = [json.loads(line) for line in (REPO / "traces" / "demo_b8_embedded.jsonl").open()]
    first = {task: next(x for x in lines if x["task"] == task.value) for task in traces}
    for task, records in traces.items():
        assert _replay(records[0].trace, 7) == first[task]["accept_lengths"]
        # The demo traces carry no prompt length: the scenario draws one.
        assert records[0].prompt_tokens is None


def test_a_line_of_hard_positions_is_the_recording_it_came_from(tmp_path: Path) -> None:
    lengths = [3, 16, 5, 1, 8, 16, 2]
    recorded = trace_from_accept_lengths(lengths, 16)
    line = {"task": "code", "block_size": 16, "prompt_tokens": 40,
            "output_tokens": recorded.num_output_tokens,
            "hard_positions": list(recorded.hard_positions)}  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps({**line, "hard_positions": [4, 2]}))
    with pytest.raises(ValueError, match=r"t\.jsonl:2: .*increasing"):
        load_traces(path, 16)
    path.write_text(json.dumps(line) + "\n")
    (record,) = load_traces(path, 16)[Task.CODE]
    assert record.prompt_tokens == 40 and record.trace == recorded  # the rates too
