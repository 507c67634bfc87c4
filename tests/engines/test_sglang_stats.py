"""SGLang per-request spec_* fields and /metrics gauges, read from shapes recorded from SGLang's
own source (tests/fixtures/sglang/README.md names the files and commits)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engines.sglang_stats import parse_sglang_meta, parse_sglang_response
from engines.stats_window import CounterWindow, parse_prometheus

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sglang"
# The fixtures' run: k = 7 (--speculative-num-draft-tokens 8), 20 verify steps, 46 accepted.
EXPECTED_PER_POSITION = [16, 11, 8, 5, 3, 2, 1]


def _json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


@pytest.mark.parametrize(
    "name",
    [
        "generate_meta_info.json",
        "generate_meta_info_v0515.json",
        "chat_completion_spec_details.json",
    ],
)
def test_every_recorded_shape_gives_the_same_outcome(name: str) -> None:
    outcome = parse_sglang_response(_json(name))
    assert outcome is not None
    assert outcome.num_output_tokens == 66
    assert (outcome.num_drafts, outcome.num_draft_tokens, outcome.num_accepted_tokens) == (
        20,
        140,
        46,
    )
    assert outcome.accepted_per_position == EXPECTED_PER_POSITION
    # SGLang's own spec_accept_length for this request is 3.3 (= 66 / 20).
    assert outcome.mean_accept_length == pytest.approx(3.3)


def test_meta_info_is_read_directly() -> None:
    meta = _json("generate_meta_info.json")["meta_info"]
    outcome = parse_sglang_meta(meta)
    assert outcome is not None and outcome.num_accepted_tokens == 46


def test_details_inside_a_choice_are_found() -> None:
    body = _json("chat_completion_spec_details.json")
    details = body.pop("sglext")
    body["choices"][0]["sglext"] = details
    outcome = parse_sglang_response(body)
    assert outcome is not None and outcome.num_drafts == 20


def test_no_verify_steps_means_no_speculation_reported() -> None:
    body = _json("chat_completion_spec_details.json")
    # SpecTokensDetails defaults every field to 0 when the server did not speculate.
    body["sglext"]["spec_tokens_details"] = {
        key: 0 if not isinstance(value, list) else []
        for key, value in body["sglext"]["spec_tokens_details"].items()
    }
    assert parse_sglang_response(body) is None
    assert parse_sglang_response({"choices": [], "usage": {"completion_tokens": 3}}) is None


def test_accepted_count_falls_back_to_accept_length() -> None:
    outcome = parse_sglang_meta({"spec_verify_ct": 20, "spec_accept_length": 3.3})
    assert outcome is not None
    assert outcome.num_accepted_tokens == 46
    assert outcome.accepted_per_position == []


def test_oldest_field_names_are_read() -> None:
    meta = {"spec_verify_ct": 4, "spec_accept_token_num": 6, "spec_draft_token_num": 12}
    outcome = parse_sglang_meta(meta)
    assert outcome is not None
    assert (outcome.num_accepted_tokens, outcome.num_draft_tokens) == (6, 12)


def test_per_position_counts_are_used_when_sglang_reports_them() -> None:
    meta = {
        "spec_verify_ct": 4,
        "spec_num_correct_drafts": 3,
        "spec_num_correct_drafts_by_position": [2, 1, 0],
    }
    outcome = parse_sglang_meta(meta)
    assert outcome is not None and outcome.accepted_per_position == [2, 1, 0]


def test_recorded_metrics_page_gives_running_waiting_and_accept_length() -> None:
    sample = parse_prometheus((FIXTURES / "metrics.txt").read_text(), time_s=1.0)
    assert (sample.running, sample.waiting) == (5.0, 2.0)
    assert sample.accept_length == pytest.approx(3.3)
    assert sample.num_drafts is None and sample.accepted_per_position == ()


def test_idle_gauge_zero_is_not_an_accept_length() -> None:
    sample = parse_prometheus((FIXTURES / "metrics_idle.txt").read_text())
    assert sample.accept_length is None
    assert sample.running == 0.0


def test_window_averages_the_gauge_when_no_counters_exist() -> None:
    window = CounterWindow(window_s=10.0)
    text = (FIXTURES / "metrics.txt").read_text()
    window.add(parse_prometheus(text, time_s=0.0))
    window.add(parse_prometheus(text.replace("} 3.3\n", "} 2.7\n"), time_s=1.0))
    stats = window.stats()
    assert stats is not None
    assert stats.mean_accept_length == pytest.approx(3.0)
    assert stats.accept_rate_per_position == []
