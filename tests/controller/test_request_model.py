"""The request model and parser on their own: every field's type and range, every message
shape OpenAI defines, the JSON parser's limits (issue 15, items 1-5 and 8)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.openai_errors import ApiError
from controller.request_parse import parse_request
from engines.base import Endpoint

USER = {"role": "user", "content": "hi"}


def _chat(**fields: Any) -> bytes:
    return json.dumps({"model": "demo", "messages": [USER], "max_tokens": 4, **fields}).encode()


def _rejected(raw: bytes, endpoint: Endpoint = "chat") -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_request(endpoint, raw, None, True)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        # 1. one field silently stopped the embedded engine
        ({"seed": 1.5}, "seed", "integer within int64, got 1.5"),
        ({"seed": True}, "seed", "got true"),
        ({"seed": "abc"}, "seed", 'got "abc"'),
        ({"seed": [1]}, "seed", "got [1]"),
        ({"seed": 2**64 + 5}, "seed", "beyond the 64-bit integer range"),
        ({"seed": 2**63}, "seed", "got 9223372036854775808"),
        # 2. an integer the engine cannot take failed every request of its step
        ({"top_k": 1180591620717411303424}, "top_k", "beyond the 64-bit"),
        ({"top_k": -2}, "top_k", "from -1 to"),
        ({"top_k": 2.0}, "top_k", "got 2.0"),
        # 4. stop: a string or at most 4 strings
        ({"stop": 5}, "stop", "at most 4 strings, got 5"),
        ({"stop": [1]}, "stop", "got [1]"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        # 8. max_tokens 0 generated 256 tokens
        ({"max_tokens": 0}, "max_tokens", "from 1 to"),
        ({"max_tokens": "9"}, "max_tokens", "must be an integer"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "from 1 to"),
        ({"n": 0}, "n", "from 1 to 128"),
        ({"n": 129}, "n", "from 1 to 128"),
        ({"temperature": 2.5}, "temperature", "finite number in [0, 2]"),
        ({"temperature": "hot"}, "temperature", "finite number"),
        ({"top_p": 0}, "top_p", "(0, 1]"),
        ({"presence_penalty": -3}, "presence_penalty", "[-2, 2]"),
        ({"frequency_penalty": True}, "frequency_penalty", "finite number"),
        ({"logit_bias": {"50256": 101}}, "logit_bias.50256", "[-100, 100]"),
        ({"stream": "yes"}, "stream", "must be a boolean"),
        ({"stream_options": []}, "stream_options", "must be an object"),
        ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage", "boolean"),
        ({"logprobs": 1}, "logprobs", "boolean"),
        ({"top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
        ({"tools": {"type": "function"}}, "tools", "array of objects"),
        ({"user": 7}, "user", "string"),
        ({"model": ""}, "model", "non-empty string"),
        ({"model": None}, "model", "non-empty string"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(fields: dict[str, Any], param: str, needle: str) -> None:
    error = _rejected(_chat(**fields))
    assert error.param == param
    assert needle in error.message


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b'{"model": "demo", "messages": [], "temperature": NaN}', "got NaN"),
        (b'{"model": "demo", "messages": [], "temperature": Infinity}', "got Infinity"),
        (b'{"model": "demo", "messages": [], "top_p": -Infinity}', "got -Infinity"),
        (b'{"model": "demo", "messages": [], "temperature": 1e400}', "got Infinity"),
    ],
)
def test_nan_and_infinity_are_refused(raw: bytes, needle: str) -> None:
    raw = raw.replace(b"[]", json.dumps([USER]).encode())
    assert needle in _rejected(raw).message


@pytest.mark.parametrize(
    "fields",
    [
        {"seed": 2**63 - 1},
        {"seed": -(2**63)},
        {"seed": None, "stop": None, "temperature": None, "stream": None},
        {"stop": "\n"},
        {"stop": ["a", "b", "c", "d"]},
        {"temperature": 0, "top_p": 1, "top_k": -1, "n": 1, "max_completion_tokens": 1},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"logit_bias": {"50256": -100}, "tool_choice": "auto", "response_format": {}},
        {"some_engine_extension": [1, {"x": None}], "chat_template_kwargs": {}},
    ],
)
def test_good_fields_and_unknown_ones_pass(fields: dict[str, Any]) -> None:
    raw = _chat(**fields)
    parsed = parse_request("chat", raw, None, True)
    assert parsed.raw == raw  # forwarded as the client's own bytes


TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "developer", "content": "be brief"}, USER],
        [{"role": "system", "content": [{"type": "text", "text": "be brief"}]}, USER],
        [USER, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}],
        [USER, {"role": "assistant", "tool_calls": [TOOL_CALL]}],
        [USER, {"role": "assistant"}],
        [USER, {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}],
        [USER, {"role": "tool", "content": "2", "tool_call_id": "c1"}],
        [USER, {"role": "function", "name": "f", "content": None}],
        [{"role": "user", "content": "hi", "name": "ann"}],
        [{"role": "user", "content": [{"type": "input_video", "video": "x"}]}],  # newer type
    ],
)
def test_every_openai_message_shape_is_accepted(messages: list[dict[str, Any]]) -> None:
    raw = json.dumps({"model": "demo", "messages": messages}).encode()
    assert parse_request("chat", raw, None, True).body["messages"] == messages


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        (["hi"], "messages[0]"),
        ([{"content": "hi"}], "messages[0].role"),
        ([{"role": "robot", "content": "hi"}], "messages[0].role"),
        ([{"role": ["user"], "content": "hi"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": None}], "messages[0].content"),
        ([{"role": "tool", "content": None}], "messages[0].content"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": {"type": "text"}}], "messages[0].content"),
        ([{"role": "user", "content": ["hi"]}], "messages[0].content[0]"),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0]"),
        ([USER, {"role": "assistant", "tool_calls": {}}], "messages[1].tool_calls"),
        ([USER, {"role": "assistant", "tool_calls": [{}]}], "messages[1].tool_calls[0].function"),
        (
            [USER, {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}],
            "messages[1].tool_calls[0].function.arguments",
        ),
        ([{"role": "user", "content": "hi", "name": 1}], "messages[0].name"),
        ([{"role": "tool", "content": "2", "tool_call_id": 1}], "messages[0].tool_call_id"),
    ],
)
def test_a_malformed_message_is_a_400_naming_it(messages: list[Any], param: str) -> None:
    raw = json.dumps({"model": "demo", "messages": messages}).encode()
    assert _rejected(raw).param == param


@pytest.mark.parametrize(
    "prompt", ["", "hi", ["a", "b"], [99999, 1], [0], [[1, 2], [3]], [2**31 - 1]]
)
def test_every_prompt_shape_is_accepted(prompt: Any) -> None:
    raw = json.dumps({"model": "demo", "prompt": prompt, "max_tokens": 4}).encode()
    assert parse_request("completion", raw, None, True).body["prompt"] == prompt


@pytest.mark.parametrize(
    ("prompt", "needle"),
    [
        ([-1, 1], "token ids must be from 0 to 2147483647, got -1"),
        ([[1, -2]], "got -2"),
        ([2**31], "got 2147483648"),
        ([], "must be a string"),
        ([[]], "must be a string"),
        ([1, "a"], "must be a string"),
        ([True], "must be a string"),
        ([1.0], "must be a string"),
        (None, "must be a string"),
        ({"text": "hi"}, "must be a string"),
    ],
)
def test_a_bad_prompt_is_a_400(prompt: Any, needle: str) -> None:
    raw = json.dumps({"model": "demo", "prompt": prompt}).encode()
    error = _rejected(raw, "completion")
    assert error.param == "prompt" and needle in error.message


def test_completions_have_their_own_fields() -> None:
    raw = json.dumps({"model": "demo", "prompt": "x", "logprobs": 2, "echo": True}).encode()
    parse_request("completion", raw, None, True)  # an integer logprobs, unlike chat
    error = _rejected(
        json.dumps({"model": "demo", "prompt": "x", "logprobs": 21}).encode(), "completion"
    )
    assert error.param == "logprobs"


MESSAGES = b'"messages": [{"role": "user", "content": '


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        # 5. parser 500s
        (b'{"model": "demo", "x": ' + b"[" * 1100 + b"]" * 1100 + b"}", "nested deeper than 1024"),
        (b'{"model": "demo", "x": ' + b"1" * 5000 + b"}", "integer literal over 4300 digits"),
        (b'{"model": "demo", ' + MESSAGES + b'"\xed\xa0\x80"}]}', "not valid UTF-8"),
        (b'{"model": "demo", ' + MESSAGES + b'"\xff"}]}', "not valid UTF-8"),
        (b'{"model": "demo", ' + MESSAGES + b'"\\ud800"}]}', "lone UTF-16 surrogate"),
        (b'{"model": "demo", ' + MESSAGES + b'"\\udc00x"}]}', "lone UTF-16 surrogate"),
        # Nesting that parses but cannot be forwarded once the draftctl field is removed.
        (
            b'{"model": "demo", '
            + MESSAGES
            + b'"hi"}], "draftctl": {"task": "math"}, "x": '
            + b"[" * 300
            + b"]" * 300
            + b"}",
            "nested deeper than 254",
        ),
        (b"[" * 1100 + b"]" * 1100, "nested deeper than 1024"),
        (b"{not json", "not valid JSON"),
        (b'"a string"', "must be a JSON object"),
    ],
)
def test_parser_limits_are_400s(raw: bytes, needle: str) -> None:
    assert needle in _rejected(raw).message


def test_bodies_the_stdlib_reads_are_still_accepted_and_reencoded() -> None:
    body = {"model": "demo", "messages": [USER]}
    for raw in (
        b"\xef\xbb\xbf" + json.dumps(body).encode(),
        json.dumps(body).encode("utf-16"),
        json.dumps(body).encode("utf-32"),
        json.dumps({**body, "x": 2**70}).encode()[:-1] + b', "y": "\\ud83d\\ude00"}',
    ):
        parsed = parse_request("chat", raw, None, True)
        assert parsed.raw is not None and json.loads(parsed.raw)["model"] == "demo"
    # A big integer in an unknown field parses, but no backend could be sent it.
    error = _rejected(json.dumps({**body, "x": 2**70}).encode("utf-16"))
    assert "cannot be forwarded: Integer exceeds 64-bit range" in error.message
