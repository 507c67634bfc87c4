"""The upstream body: the client's bytes with draftctl's fields spliced in, or re-encoded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engines.request_body import upstream_body

USAGE = {"stream_options": {"include_usage": True}}


def _send(body: dict[str, Any], raw: bytes | None, extras: dict[str, Any], stream: bool):
    payload, wants_usage = upstream_body(body, raw, extras, stream)
    return payload, json.loads(payload), wants_usage


def test_a_stream_gets_stream_options_spliced_in_front_of_the_clients_bytes() -> None:
    message = b'{"role": "user", "content": "h\\u00e9 \xc3\xa9"}'
    raw = b'{"model": "m", "messages": [' + message + b'], "stream": true}'
    body = json.loads(raw)
    payload, sent, wants_usage = _send(body, raw, {}, True)
    assert sent == {**body, **USAGE}
    assert payload.endswith(raw[1:])  # the client's bytes go on unchanged
    assert wants_usage is False


def test_a_client_that_asked_for_usage_is_forwarded_byte_for_byte() -> None:
    raw = b'{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true}}'
    payload, _, wants_usage = _send(json.loads(raw), raw, {}, True)
    assert payload == raw
    assert wants_usage is True


def test_a_key_that_must_change_is_re_encoded_from_the_parsed_body() -> None:
    raw = b'{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":false}}'
    _, sent, wants_usage = _send(json.loads(raw), raw, {}, True)
    assert sent["stream_options"] == {"include_usage": True}
    assert wants_usage is False


def test_backend_extras_are_spliced_or_override_the_clients_value() -> None:
    extras = {"return_spec_tokens_details": True}
    raw = b'{"model":"m","prompt":"x"}'
    payload, sent, _ = _send(json.loads(raw), raw, extras, False)
    assert sent == {"return_spec_tokens_details": True, "model": "m", "prompt": "x"}
    assert payload.endswith(raw[1:])
    raw = b'{"model":"m","prompt":"x","return_spec_tokens_details":false}'
    _, sent, _ = _send(json.loads(raw), raw, extras, False)
    assert sent["return_spec_tokens_details"] is True


def test_nothing_to_add_sends_the_raw_bytes_or_the_encoded_body() -> None:
    raw = b'{"model":"m","prompt":"x"}'
    assert upstream_body(json.loads(raw), raw, {}, False) == (raw, False)
    body = {"model": "m", "prompt": "x"}  # raw None: the body was changed after parsing
    payload, _ = upstream_body(body, None, {}, False)
    assert json.loads(payload) == body


@pytest.mark.parametrize(
    "raw",
    [
        b'  \n{"model":"m","prompt":"x"}\n',
        b"{ }",
        b"\xef\xbb\xbf" + b'{"model":"m","prompt":"x"}',  # a UTF-8 BOM: re-encoded
        '{"model":"m","prompt":"x"}'.encode("utf-16-le"),
        '{"model":"m","prompt":"x"}'.encode("utf-16-be"),
    ],
)
def test_odd_but_valid_framing_still_gives_valid_json(raw: bytes) -> None:
    body = json.loads(raw.decode("utf-8-sig") if raw.startswith(b"\xef") else raw)
    _, sent, _ = _send(body, raw, {}, True)
    assert sent == {**body, **USAGE}
