"""vLLM per-request metrics and /metrics counters, read from shapes recorded on a real vLLM 0.32
CPU server (tests/fixtures/vllm/, see docs/integration.md) and from hand-made variants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engines.spec_counts import accepted_per_position
from engines.stats_window import parse_prometheus
from engines.vllm_stats import parse_vllm_response_metrics

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def _json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def _last_sse_chunk(name: str) -> dict[str, Any]:
    events = [
        line.removeprefix("data: ")
        for line in (FIXTURES / name).read_text().splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    chunk: dict[str, Any] = json.loads(events[-1])
    return chunk


def _spec(**overrides: Any) -> dict[str, Any]:
    spec = {
        "mean_acceptance_length": 1.8333333333333333,
        "draft_acceptance_rate": 0.2777777777777778,
        "acceptance_histogram": [2, 3, 1, 0],
        "num_spec_steps": 6,
        "num_accepted_draft_tokens": 5,
        "num_draft_tokens": 18,
        "num_spec_tokens": 3,
        "per_step_accepted": None,
        "per_step_drafted": None,
    }
    spec.update(overrides)
    return {"usage": {"completion_tokens": 11}, "metrics": {"speculative_decoding": spec}}


def test_recorded_chat_body_gives_counts_and_accept_length() -> None:
    outcome = parse_vllm_response_metrics(_json("chat_completion_spec.json"))
    assert outcome is not None
    assert outcome.num_output_tokens == 16
    assert (outcome.num_drafts, outcome.num_draft_tokens, outcome.num_accepted_tokens) == (
        15,
        105,
        0,
    )
    assert outcome.accepted_per_position == [0] * 7
    assert outcome.mean_accept_length == 1.0


def test_recorded_stream_usage_chunk_gives_the_same_outcome_as_the_body() -> None:
    chunk = _last_sse_chunk("chat_stream_spec.sse")
    assert chunk["choices"] == []  # the usage chunk carries the metrics
    assert parse_vllm_response_metrics(chunk) == parse_vllm_response_metrics(
        _json("chat_completion_spec.json")
    )


def test_recorded_completion_body_is_read_too() -> None:
    outcome = parse_vllm_response_metrics(_json("completion_spec.json"))
    assert outcome is not None and outcome.num_drafts == 15


def test_server_without_speculation_reports_nothing() -> None:
    assert parse_vllm_response_metrics(_json("chat_completion_nospec.json")) is None
    assert parse_vllm_response_metrics({"choices": []}) is None


def test_histogram_gives_per_position_accepts_and_mean_accept_length() -> None:
    outcome = parse_vllm_response_metrics(_spec())
    assert outcome is not None
    # 3 steps accepted >= 1 draft, 1 step accepted >= 2, none accepted 3.
    assert outcome.accepted_per_position == [4, 1, 0]
    assert outcome.mean_accept_length == pytest.approx(1 + 5 / 6)
    assert outcome.num_output_tokens == 11


def test_detailed_level_gives_per_step_accept_lengths_with_bonus() -> None:
    outcome = parse_vllm_response_metrics(
        _spec(per_step_accepted=[0, 1, 2, 1, 1, 0], per_step_drafted=[3] * 6)
    )
    assert outcome is not None
    assert outcome.accept_lengths == [1, 2, 3, 2, 2, 1]
    assert outcome.mean_accept_length == pytest.approx(11 / 6)


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_spec_steps": "6"},
        {"acceptance_histogram": [1, -2]},
        {"num_accepted_draft_tokens": None},
    ],
)
def test_malformed_metrics_read_as_not_reported(overrides: dict[str, Any]) -> None:
    assert parse_vllm_response_metrics(_spec(**overrides)) is None


def test_accepted_per_position_is_a_suffix_sum() -> None:
    assert accepted_per_position([5, 0, 2, 1]) == [3, 3, 1]
    assert accepted_per_position([7]) == []


def test_recorded_metrics_page_parses_to_counters_and_gauges() -> None:
    sample = parse_prometheus((FIXTURES / "metrics_spec_busy.txt").read_text(), time_s=3.0)
    assert sample.time_s == 3.0
    assert (sample.running, sample.waiting) == (6.0, 0.0)
    assert (sample.num_drafts, sample.num_draft_tokens, sample.num_accepted_tokens) == (
        777.0,
        5439.0,
        0.0,
    )
    assert sample.accepted_per_position == (0.0,) * 7
    assert sample.accept_length is None


def test_recorded_metrics_page_without_speculation_has_no_spec_series() -> None:
    sample = parse_prometheus((FIXTURES / "metrics_nospec.txt").read_text())
    assert (sample.running, sample.waiting) == (0.0, 0.0)
    assert sample.num_drafts is None and sample.accepted_per_position == ()


def test_counters_are_summed_over_engines_and_positions_ordered_numerically() -> None:
    text = "\n".join(
        [
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0',
            *(
                f'{PER_POS}{{engine="0",position="{p}"}} {v}'
                for p, v in [(10, 1.0), (2, 3.0), (0, 9.0), (1, 4.0)]
                + [(p, 0.0) for p in range(3, 10)]
            ),
            'vllm:num_requests_running{engine="0"} 2',
            'vllm:num_requests_running{engine="1"} 1',
        ]
    )
    sample = parse_prometheus(text)
    assert sample.num_drafts == 15.0
    assert sample.running == 3.0
    assert sample.accepted_per_position[:3] == (9.0, 4.0, 3.0)
    assert sample.accepted_per_position[10] == 1.0
