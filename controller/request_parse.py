"""Parse and validate an OpenAI request body before anything else looks at it.

The JSON parser's limits (nesting depth, integer size, encodings) and every known OpenAI
field's type and range (controller/request_model.py) are checked here; each problem is a 400
naming the input. The backend still validates what only it can know (the vocabulary, the
context length) and its 4xx answers pass through to the client unchanged.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import orjson

from controller.openai_errors import bad_request
from controller.request_model import validate
from engines.base import Endpoint
from policies.types import TASKS, Task

TASK_HEADER = "x-draftctl-task"
_TASK_NAMES = ", ".join(t.value for t in TASKS)
_DRAFTCTL_KEYS = frozenset({"task"})
# Bodies larger than this are parsed and validated on a worker thread, so that one large
# request does not hold up the event loop (and every other request) while it is checked.
OFF_LOOP_BYTES = 256 * 1024
MAX_DEPTH = 1024  # orjson's nesting limit; the stdlib fallback is held to the same
# The deepest body orjson can encode again: deeper ones are refused when they must be.
_MAX_ENCODE_DEPTH = 254


@dataclass(frozen=True)
class ParsedRequest:
    endpoint: Endpoint
    body: dict[str, Any]  # the body to forward: the ``draftctl`` field removed
    # ``body`` as bytes: the client's own when they are plain UTF-8 JSON equal to ``body``
    # (no ``draftctl`` field), else ``body`` encoded again here, where an error is a 400.
    raw: bytes
    model: str
    is_stream: bool
    wants_usage: bool  # the client itself asked for the streamed usage chunk
    task_hint: Task | None


def _task(value: object, where: str) -> Task:
    if not isinstance(value, str) or value not in {t.value for t in TASKS}:
        raise bad_request(f"{where} must be one of {_TASK_NAMES}, got {value!r}", param=where)
    return Task(value)


def _load_object(raw: bytes) -> tuple[dict[str, Any], bool]:
    """(the body, whether ``raw`` is plain JSON as orjson reads it: UTF-8, no BOM)."""
    try:
        body, is_plain = orjson.loads(raw), True  # ~2x faster than the stdlib on large bodies
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):
            raise _too_deep() from None
        body, is_plain = _load_lenient(raw), False
    if not isinstance(body, dict):
        raise bad_request(f"Request body must be a JSON object, got {type(body).__name__}")
    return body, is_plain


def _load_lenient(raw: bytes) -> Any:
    """What the stdlib also accepts (a BOM, UTF-16/32, NaN, integers beyond 64 bits) still
    parses, within the same limits; its error message names the first problem otherwise."""
    encoding = json.detect_encoding(raw)
    try:
        text = raw.decode(encoding)  # strict: invalid UTF-8 and encoded surrogates fail
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"Request body is not valid {encoding.upper()}: {exc.reason} at byte {exc.start}"
        ) from None
    try:
        body = json.loads(text)
    except RecursionError:
        raise _too_deep() from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"Request body is not valid JSON: {exc}") from None
    except ValueError:  # int() refuses literals over sys.get_int_max_str_digits()
        raise bad_request(
            f"Request body has an integer literal over {sys.get_int_max_str_digits()} digits"
        ) from None
    return body  # encoded again before forwarding, which refuses what cannot be sent


def _too_deep() -> Exception:
    return bad_request(f"Request body is nested deeper than {MAX_DEPTH} levels")


def _encode(body: dict[str, Any]) -> bytes:
    """``body`` as the bytes to forward; what cannot be encoded is the client's error: a
    lone surrogate escape (``"\\ud800"``), an integer beyond 64 bits, deep nesting."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError as exc:
        reason = str(exc)
        if reason.startswith("Recursion limit"):
            reason = f"nested deeper than {_MAX_ENCODE_DEPTH} levels"
        elif "surrogates" in reason:
            reason = "a lone UTF-16 surrogate escape (such as \\ud800) is not text"
        raise bad_request(f"Request body cannot be forwarded: {reason}") from None


def _body_hint(body: dict[str, Any]) -> Task | None:
    ext = body.pop("draftctl", None)
    if ext is None:
        return None
    if not isinstance(ext, dict):
        raise bad_request('\'draftctl\' must be an object such as {"task": "math"}', "draftctl")
    unknown = sorted(set(ext) - _DRAFTCTL_KEYS)
    if unknown:
        raise bad_request(f"'draftctl' has unknown keys {unknown}; allowed: task", "draftctl")
    return None if ext.get("task") is None else _task(ext["task"], "draftctl.task")


def parse_request(
    endpoint: Endpoint, raw: bytes, header_task: str | None, allow_hint: bool
) -> ParsedRequest:
    """Validate ``raw``; raise ApiError (4xx) naming the first problem.

    Pure CPU work: the gateway runs it on a worker thread for bodies over OFF_LOOP_BYTES.
    """
    body, is_plain = _load_object(raw)
    validate(endpoint, body)
    has_extension = "draftctl" in body
    hint = _body_hint(body)
    if header_task is not None:
        hint = _task(header_task.strip().lower(), f"header {TASK_HEADER}")
    is_stream = body.get("stream") is True
    options = body.get("stream_options") or {}
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        raw=raw if is_plain and not has_extension else _encode(body),
        model=body["model"],
        is_stream=is_stream,
        wants_usage=is_stream and options.get("include_usage") is True,
        task_hint=hint if allow_hint else None,
    )
