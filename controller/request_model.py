"""The OpenAI request fields checked at the edge: one table per endpoint, applied to the
parsed body before anything reaches a backend.

Each known field has a check of its real type and range; a rejection is a 400 naming
``param`` (``seed``, ``messages[2].content``). Unknown fields pass through untouched (pools
forward the client's bytes). ``null`` means "the default" for every optional field.

Plain functions over the parsed dict rather than a pydantic model: they checked a one-message
chat body in 1.1 µs and a 41-message one in 7.4 µs where an equivalent strict pydantic model
took 2.7 and 37.7 µs (docs/gateway.md, "Request validation"); the gateway's added latency is a
measured target.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from controller.openai_errors import bad_request
from engines.base import Endpoint
from engines.openai_format import CHAT_ROLES

# Checks one field's value (never None); raises ApiError naming ``param``.
Check = Callable[[str, Any], None]

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP = 4
ROLES = CHAT_ROLES
# Roles whose ``content`` may be null or missing (an assistant turn that only calls tools).
_OPTIONAL_CONTENT_ROLES = frozenset({"assistant", "function"})
# Content part type -> the member that must hold its payload (text parts: a string).
_PART_PAYLOADS = {
    "text": "text",
    "refusal": "refusal",
    "image_url": "image_url",
    "input_audio": "input_audio",
    "file": "file",
}


def _show(value: Any) -> str:
    """The value as the client wrote it, cut short (a rejected value may be huge)."""
    if type(value) is float and value.is_integer() and abs(value) >= 2**63:
        return "a number beyond the 64-bit integer range"  # orjson reads those as floats
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def integer(low: int, high: int, what: str = "") -> Check:
    """An integer in [low, high]; ``what`` names the range in messages (default: its ends)."""
    what = what or f"an integer from {low} to {high}"

    def check(param: str, value: Any) -> None:
        # type() rather than isinstance(): a JSON true is a bool, which is an int subclass.
        if type(value) is not int or not low <= value <= high:
            raise bad_request(f"'{param}' must be {what}, got {_show(value)}", param)

    return check


def number(low: float, high: float, is_low_open: bool = False) -> Check:
    """A finite JSON number in [low, high] ((low, high] when ``is_low_open``)."""
    opening = "(" if is_low_open else "["

    def check(param: str, value: Any) -> None:
        kind = type(value)
        is_ok = (kind is float or kind is int) and low <= value <= high and math.isfinite(value)
        if not is_ok or (is_low_open and value == low):
            raise bad_request(
                f"'{param}' must be a finite number in {opening}{low}, {high}], got {_show(value)}",
                param,
            )

    return check


def _boolean(param: str, value: Any) -> None:
    if type(value) is not bool:
        raise bad_request(f"'{param}' must be a boolean, got {_show(value)}", param)


def _string(param: str, value: Any) -> None:
    if type(value) is not str:
        raise bad_request(f"'{param}' must be a string, got {_show(value)}", param)


def _object(param: str, value: Any) -> None:
    if type(value) is not dict:
        raise bad_request(f"'{param}' must be an object, got {_show(value)}", param)


def _objects(param: str, value: Any) -> None:
    if type(value) is not list or any(type(item) is not dict for item in value):
        raise bad_request(f"'{param}' must be an array of objects, got {_show(value)}", param)


def _string_or_object(param: str, value: Any) -> None:
    if type(value) is not str and type(value) is not dict:
        raise bad_request(f"'{param}' must be a string or an object, got {_show(value)}", param)


def _model(param: str, value: Any) -> None:
    if type(value) is not str or not value:
        raise bad_request("'model' must be a non-empty string naming a served model", param)


def _stop(param: str, value: Any) -> None:
    if type(value) is str:
        return
    if type(value) is not list or len(value) > MAX_STOP or any(type(s) is not str for s in value):
        raise bad_request(
            f"'stop' must be a string or an array of at most {MAX_STOP} strings, "
            f"got {_show(value)}",
            param,
        )


def _stream_options(param: str, value: Any) -> None:
    _object(param, value)
    for key in ("include_usage", "continuous_usage_stats"):
        if value.get(key) is not None:
            _boolean(f"{param}.{key}", value[key])


def _logit_bias(param: str, value: Any) -> None:
    _object(param, value)
    for token, weight in value.items():
        _bias(f"{param}.{token}", weight)


_bias = number(-100, 100)


def _token_ids(param: str, ids: list[Any]) -> bool:
    """Whether ``ids`` is a non-empty list of token ids; raises if it holds a bad integer."""
    if not ids or not all(type(t) is int for t in ids):
        return False
    if min(ids) < 0 or max(ids) > INT32_MAX:
        bad = next(t for t in ids if not 0 <= t <= INT32_MAX)
        raise bad_request(f"'{param}' token ids must be from 0 to {INT32_MAX}, got {bad}", param)
    return True


def _prompt(param: str, value: Any) -> None:
    """A string, strings, token ids (non-negative integers) or lists of token ids."""
    if type(value) is str:
        return
    if type(value) is list and value:
        if all(type(p) is str for p in value) or _token_ids(param, value):
            return
        if all(type(p) is list and _token_ids(param, p) for p in value):
            return
    raise bad_request(
        "'prompt' must be a string, an array of strings, an array of token ids "
        f"(non-negative integers) or an array of such arrays, got {_show(value)}",
        param,
    )


def _content_parts(param: str, parts: list[Any]) -> None:
    for j, part in enumerate(parts):
        where = f"{param}[{j}]"
        kind = part.get("type") if type(part) is dict else None
        if type(kind) is not str:
            raise bad_request(f"'{where}' must be a content part object with a 'type'", where)
        payload = _PART_PAYLOADS.get(kind)
        if payload is None:
            continue  # a part type of a newer API version: the backend decides
        if kind in ("text", "refusal"):
            _string(f"{where}.{payload}", part.get(payload))
        elif part.get(payload) is None:
            raise bad_request(f"'{where}' of type {kind!r} needs '{payload}'", where)


def _content(param: str, role: str, content: Any) -> None:
    if type(content) is str:
        return
    if content is None:
        if role in _OPTIONAL_CONTENT_ROLES:
            return
        raise bad_request(f"'{param}' is required for a {role!r} message", param)
    if type(content) is not list:
        raise bad_request(
            f"'{param}' must be a string, an array of content parts or null, got {_show(content)}",
            param,
        )
    _content_parts(param, content)


def _tool_calls(param: str, calls: Any) -> None:
    if type(calls) is not list:
        raise bad_request(f"'{param}' must be an array of tool calls", param)
    for j, call in enumerate(calls):
        function = call.get("function") if type(call) is dict else None
        if type(function) is not dict:
            where = f"{param}[{j}].function"
            raise bad_request(f"'{where}' must be an object with 'name' and 'arguments'", where)
        _string(f"{param}[{j}].function.name", function.get("name"))
        _string(f"{param}[{j}].function.arguments", function.get("arguments"))


def _message(param: str, message: Any) -> None:
    if type(message) is not dict:
        raise bad_request(f"'{param}' must be an object with a 'role'", param)
    role = message.get("role")
    if type(role) is not str or role not in ROLES:
        raise bad_request(
            f"'{param}.role' must be one of {', '.join(sorted(ROLES))}, got {_show(role)}",
            f"{param}.role",
        )
    _content(f"{param}.content", role, message.get("content"))
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            _string(f"{param}.{key}", message[key])
    if message.get("tool_calls") is not None:
        _tool_calls(f"{param}.tool_calls", message["tool_calls"])


def _messages(param: str, value: Any) -> None:
    if type(value) is not list or not value:
        raise bad_request("'messages' must be a non-empty array of messages", param)
    for i, message in enumerate(value):
        # The common message, a role and a string, costs a few lookups and no call.
        if type(message) is dict and len(message) == 2 and type(message.get("content")) is str:
            role = message.get("role")
            if type(role) is str and role in ROLES:
                continue
        _message(f"messages[{i}]", message)


_SAMPLING: dict[str, Check] = {
    "model": _model,
    "stream": _boolean,
    "stream_options": _stream_options,
    "max_tokens": integer(1, INT32_MAX),
    "min_tokens": integer(0, INT32_MAX),
    "n": integer(1, 128),
    "temperature": number(0, 2),
    "top_p": number(0, 1, is_low_open=True),
    "top_k": integer(-1, INT32_MAX),
    "min_p": number(0, 1),
    "presence_penalty": number(-2, 2),
    "frequency_penalty": number(-2, 2),
    "repetition_penalty": number(0, 100, is_low_open=True),
    "seed": integer(INT64_MIN, INT64_MAX, "an integer within int64"),
    "stop": _stop,
    "logit_bias": _logit_bias,
    "user": _string,
    "ignore_eos": _boolean,
}

CHAT_FIELDS: dict[str, Check] = {
    **_SAMPLING,
    "messages": _messages,
    "max_completion_tokens": integer(1, INT32_MAX),
    "logprobs": _boolean,
    "top_logprobs": integer(0, 20),
    "tools": _objects,
    "tool_choice": _string_or_object,
    "parallel_tool_calls": _boolean,
    "response_format": _object,
}

COMPLETION_FIELDS: dict[str, Check] = {
    **_SAMPLING,
    "prompt": _prompt,
    "logprobs": integer(0, 20),
    "best_of": integer(1, 128),
    "echo": _boolean,
    "suffix": _string,
}

_MODELS: dict[Endpoint, tuple[dict[str, Check], tuple[str, ...]]] = {
    "chat": (CHAT_FIELDS, ("model", "messages")),
    "completion": (COMPLETION_FIELDS, ("model", "prompt")),
}


def validate(endpoint: Endpoint, body: dict[str, Any]) -> None:
    """Check every known field of ``body``; raise ApiError (400) naming the first bad one."""
    fields, required = _MODELS[endpoint]
    for name in required:
        if body.get(name) is None:
            fields[name](name, None)  # each check's message says what the field must be
    for key, value in body.items():
        check = fields.get(key)
        if check is not None and value is not None:
            check(key, value)
