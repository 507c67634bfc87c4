"""SSE pass-through: plain chunks untouched, draftctl on the final chunk, usage handled."""

from __future__ import annotations

import json
from typing import Any

from engines.base import Outcome
from engines.sse import SseAnnotator
from engines.vllm_stats import parse_vllm_response_metrics
from tests.controller.fake_upstream import vllm_spec_metrics


def _ev(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk(text: str, finish: str | None = None) -> bytes:
    return _ev(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
        }
    )


USAGE = _ev(
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        "metrics": {"speculative_decoding": vllm_spec_metrics(7)},
    }
)
STREAM = _chunk("a") + _chunk("b") + _chunk("c", "stop") + USAGE + b"data: [DONE]\n\n"


def _annotate(outcome: Outcome) -> dict[str, Any]:
    return {"k": 7, "accept_length": outcome.mean_accept_length}


def _events(data: bytes) -> list[bytes]:
    return [e for e in data.split(b"\n\n") if e]


def _run(wants_usage: bool, pieces: list[bytes]) -> tuple[bytes, SseAnnotator]:
    annotator = SseAnnotator(_annotate, parse_vllm_response_metrics, wants_usage)
    out = b"".join(annotator.feed(p) for p in pieces) + annotator.finish()
    return out, annotator


def test_plain_block_is_passed_through_as_is() -> None:
    annotator = SseAnnotator(_annotate, parse_vllm_response_metrics, False)
    block = _chunk("a") + _chunk("b")
    assert annotator.feed(block) is block


def test_usage_stripped_and_final_chunk_annotated_when_client_did_not_ask() -> None:
    out, annotator = _run(False, [STREAM])
    events = _events(out)
    assert events[:2] == [_chunk("a").strip(), _chunk("b").strip()]
    final = json.loads(events[2][6:])
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["draftctl"] == {"k": 7, "accept_length": 3.5}
    assert events[3] == b"data: [DONE]" and len(events) == 4
    assert annotator.outcome.num_output_tokens == 3 and annotator.outcome.num_drafts == 4


def test_usage_kept_and_annotated_when_client_asked() -> None:
    out, _ = _run(True, [STREAM])
    events = _events(out)
    usage = json.loads(events[3][6:])
    assert usage["usage"]["completion_tokens"] == 3 and usage["draftctl"]["k"] == 7
    assert "draftctl" not in json.loads(events[2][6:])


def test_events_split_across_reads_at_any_byte() -> None:
    whole, _ = _run(False, [STREAM])
    for cut in range(1, len(STREAM), 7):
        pieces = [STREAM[i : i + cut] for i in range(0, len(STREAM), cut)]
        assert _run(False, pieces)[0] == whole


def test_error_mid_stream_flushes_held_chunk_then_error_event() -> None:
    annotator = SseAnnotator(_annotate, parse_vllm_response_metrics, False)
    out = annotator.feed(_chunk("a") + _chunk("b", "stop"))
    out += annotator.finish_with_error("backend died")
    events = _events(out)
    assert json.loads(events[1][6:])["choices"][0]["finish_reason"] == "stop"
    assert json.loads(events[2][6:])["error"]["message"] == "backend died"


def test_final_chunk_keeps_upstream_bytes_and_gains_one_draftctl_key() -> None:
    final = _chunk("c", "stop")
    out, _ = _run(False, [_chunk("a") + final + USAGE + b"data: [DONE]\n\n"])
    annotated = _events(out)[1]
    assert annotated.startswith(final.strip()[:-1] + b',"draftctl":')
    assert json.loads(annotated[6:])["draftctl"] == {"k": 7, "accept_length": 3.5}
    # An upstream chunk that already has a draftctl key gets it replaced, not duplicated.
    stale = _ev({"choices": [{"index": 0, "finish_reason": "stop"}], "draftctl": {"x": 1}})
    out, _ = _run(False, [stale + USAGE + b"data: [DONE]\n\n"])
    event = _events(out)[0]
    assert event.count(b'"draftctl"') == 1
    assert json.loads(event[6:])["draftctl"] == {"k": 7, "accept_length": 3.5}


def _spaced(event: bytes) -> bytes:
    """The same event as a server using json.dumps' default separators would write it."""
    return b"data: " + json.dumps(json.loads(event[6:])).encode() + b"\n\n"


def test_spaced_json_upstream_is_annotated_at_any_split() -> None:
    """Markers are learnt from the first event; a spaced writer keeps the spaced spellings."""
    spaced = b"".join(_spaced(e) for e in [_chunk("a"), _chunk("b"), _chunk("c", "stop"), USAGE])
    stream = spaced + b"data: [DONE]\n\n"
    for cut in (1, 5, 17, len(stream)):
        pieces = [stream[i : i + cut] for i in range(0, len(stream), cut)]
        out, annotator = _run(False, pieces)
        events = _events(out)
        assert len(events) == 4, "the usage chunk the client did not ask for is dropped"
        assert json.loads(events[2][6:])["draftctl"] == {"k": 7, "accept_length": 3.5}
        assert annotator.outcome.num_output_tokens == 3


def test_compact_upstream_with_spaced_text_in_content() -> None:
    stream = _chunk('say ": hi') + _chunk("b", "stop") + USAGE + b"data: [DONE]\n\n"
    out, _ = _run(False, [stream])
    events = _events(out)
    assert len(events) == 3
    assert json.loads(events[1][6:])["draftctl"] == {"k": 7, "accept_length": 3.5}
