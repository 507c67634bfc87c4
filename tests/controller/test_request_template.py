"""engines.openai_format's message normalisation for chat templates, and the one OpenAI error
object every layer answers with (tested here beside the request model that feeds them)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.openai_errors import ApiError, too_busy
from engines.openai_format import MessageError, error_object, template_messages
from engines.sse import error_event

TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}


def test_every_message_shape_becomes_role_and_text() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
        {"role": "assistant", "content": "so", "tool_calls": [TOOL_CALL]},
        {"role": "assistant"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "function", "name": "f", "content": None},
        {"role": "system", "content": ""},
    ]
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    assert template_messages(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": call},
        {"role": "user", "content": "<tool_response>\n2\n</tool_response>"},
        {"role": "assistant", "content": "so\n" + call},
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": "no"},
        {"role": "user", "content": "<tool_response>\n\n</tool_response>"},
        {"role": "system", "content": ""},
    ]


def test_arguments_that_are_not_json_are_kept_as_sent() -> None:
    call = {"function": {"name": "f", "arguments": "not json"}}
    (message,) = template_messages([{"role": "assistant", "tool_calls": [call]}])
    assert json.loads(message["content"].split("\n")[1]) == {"name": "f", "arguments": "not json"}


@pytest.mark.parametrize(
    ("message", "param", "needle"),
    [
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            "messages[0].content[0]",
            "this model is text-only",
        ),
        (
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
            "messages[0].content[0]",
            "this model is text-only",
        ),
        ({"role": "robot", "content": "x"}, "messages[0].role", "not a chat role"),
        ({"role": "user", "content": 5}, "messages[0].content", "must be a string"),
        ({"role": "user", "content": [{"type": "text"}]}, "messages[0].content[0]", "text part"),
        (
            {"role": "assistant", "tool_calls": [{"function": {}}]},
            "messages[0].tool_calls[0].function.name",
            "must be a string",
        ),
    ],
)
def test_what_cannot_be_rendered_names_its_param(
    message: dict[str, Any], param: str, needle: str
) -> None:
    with pytest.raises(MessageError) as caught:
        template_messages([message])
    assert caught.value.param == param and needle in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_one_error_object_for_every_layer() -> None:
    expected = {"message": "m", "type": "invalid_request_error", "param": None, "code": None}
    assert error_object("m") == {"error": expected}
    assert ApiError(400, "m").body() == {"error": expected}
    event = error_event("gone", code="backend_error")
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[6:]) == error_object("gone", "server_error", code="backend_error")


def test_a_429_says_when_to_retry() -> None:
    response = too_busy(8, 1).response()
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert json.loads(bytes(response.body))["error"]["code"] == "rate_limit_exceeded"
