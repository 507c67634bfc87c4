"""Direct to the real vLLM servers: what they report parses into draftctl's types, and the
windowed /metrics counters agree with the per-request metrics of the same requests."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from engines.base import Outcome
from engines.stats_window import CounterWindow
from engines.vllm_stats import parse_vllm_response_metrics
from tests.integration.stack import BLOCK_SIZE, MODEL, Fleet, K, scrape

pytestmark = pytest.mark.vllm


def post(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        data: bytes = response.read()
        return data


def chat(server_url: str, *, temperature: float, stream: bool = False, **extra: Any) -> bytes:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is 12 * 7?"}],
        "max_tokens": 24,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": stream,
        **extra,
    }
    return post(f"{server_url}/v1/chat/completions", body)


def outcome_of(raw: bytes) -> Outcome:
    outcome = parse_vllm_response_metrics(json.loads(raw))
    assert outcome is not None, f"no speculative metrics in {raw[:300]!r}"
    return outcome


def test_greedy_requests_accept_whole_blocks(fleet: Fleet) -> None:
    outcome = outcome_of(chat(fleet.k7_url, temperature=0.0))
    assert outcome.num_output_tokens == 24
    assert outcome.num_drafts and outcome.num_accepted_tokens is not None
    # The tiny pair is built to agree under greedy decoding: every position is accepted.
    assert len(outcome.accepted_per_position) == K == BLOCK_SIZE - 1
    assert outcome.accepted_per_position[0] == outcome.num_drafts
    assert outcome.mean_accept_length is not None and outcome.mean_accept_length > 4.0


def test_stream_usage_chunk_carries_the_same_metrics(fleet: Fleet) -> None:
    raw = chat(fleet.k7_url, temperature=0.0, stream=True, stream_options={"include_usage": True})
    events = [
        json.loads(line[len(b"data: ") :])
        for line in raw.splitlines()
        if line.startswith(b"data: {")
    ]
    usage_chunk = events[-1]
    assert usage_chunk["choices"] == [] and "usage" in usage_chunk
    streamed = outcome_of(json.dumps(usage_chunk).encode())
    assert streamed == outcome_of(chat(fleet.k7_url, temperature=0.0))  # greedy: same run


def test_no_spec_server_reports_no_speculation(fleet: Fleet) -> None:
    body = json.loads(chat(fleet.nospec_url, temperature=0.0))
    assert parse_vllm_response_metrics(body) is None
    sample = scrape(fleet.nospec_url)
    assert sample.num_drafts is None and sample.accepted_per_position == ()
    assert sample.running == 0.0 and sample.waiting == 0.0


def test_windowed_counters_match_the_requests_made(fleet: Fleet) -> None:
    window = CounterWindow(window_s=600.0)
    window.add(scrape(fleet.k7_url))
    outcomes = [
        outcome_of(chat(fleet.k7_url, temperature=0.0)),
        outcome_of(chat(fleet.k7_url, temperature=1.0, seed=3)),
    ]
    window.add(scrape(fleet.k7_url))
    stats = window.stats()
    assert stats is not None
    drafts = sum(o.num_drafts or 0 for o in outcomes)
    accepted = sum(o.num_accepted_tokens or 0 for o in outcomes)
    assert stats.num_drafts == drafts
    assert stats.num_accepted_tokens == accepted
    assert stats.num_draft_tokens == sum(o.num_draft_tokens or 0 for o in outcomes)
    assert list(stats.accepted_per_position) == [
        sum(o.accepted_per_position[p] for o in outcomes) for p in range(K)
    ]
    assert stats.mean_accept_length == pytest.approx(1 + accepted / drafts)
    assert stats.running == 0.0
