"""sim/replay.py on a hand-written trace: acceptance from recorded steps, closed-loop chains,
and policies that differ where they should."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.model import parse_policy
from sim.replay import TraceError, acceptance, compare, load_trace
from tests.sim.served_trace import request_line, write_trace


def _request(t: float, latency_ms: float, lengths: list[int], ks: list[int]) -> dict[str, object]:
    return request_line(t, lengths, ks, latency_ms=latency_ms)


def test_acceptance_marks_only_rejections_as_hard() -> None:
    line = _request(0.0, 100.0, [8, 3, 1, 5], [7, 7, 7, 4])
    trace = acceptance(line, 8)
    # Position 1 is the prefill's token; step 1 accepted all 7 (no mark), step 2 was rejected
    # at its 3rd token (position 9 + 2), step 3 at its first (12), step 4 accepted all 4.
    assert trace.num_output_tokens == 18
    assert trace.hard_positions == (11, 12)


def test_a_request_right_after_another_ends_is_its_clients_next(tmp_path: Path) -> None:
    lines = [
        _request(100.0, 200.0, [4, 4], [7, 7]),
        _request(100.21, 200.0, [4, 4], [7, 7]),  # 10 ms after the first ended
        _request(105.0, 200.0, [4, 4], [7, 7]),  # open loop: long after
    ]
    trace = load_trace(write_trace(tmp_path / "t.jsonl", lines))
    assert [r.predecessor for r in trace.requests] == [None, 0, None]
    assert trace.requests[1].gap_s == pytest.approx(0.01)


def test_no_drafting_is_slower_than_drafting_on_easy_traffic(tmp_path: Path) -> None:
    lines = [_request(100.0 + 0.3 * i, 250.0, [8] * 12, [7] * 12) for i in range(6)]
    trace = load_trace(write_trace(tmp_path / "t.jsonl", lines))
    k7 = parse_policy("kind: static\nstatic:\n  concurrency_bands: []\n  spec_tokens:\n"
                      "    math: [7]\n    code: [7]\n    chat: [7]\n")  # fmt: skip
    off = parse_policy("kind: static\nstatic:\n  concurrency_bands: []\n  spec_tokens:\n"
                       "    math: [0]\n    code: [0]\n    chat: [0]\n")  # fmt: skip
    report = compare(trace, ("off", off), ("k7", k7))
    assert report["what_if"]["mean_spec_tokens"] == 0
    assert report["recorded_policy_replayed"]["mean_accept_length"] == pytest.approx(8.0)
    assert report["delta"]["output_tok_s"] < -0.3  # every draft was accepted: off loses
    assert report["delta"]["tpot_p50"] > 0.5


def test_a_trace_without_requests_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no served request"):
        load_trace(write_trace(tmp_path / "t.jsonl", []))
    with pytest.raises(TraceError, match="no trace file"):
        load_trace(tmp_path / "missing.jsonl")
