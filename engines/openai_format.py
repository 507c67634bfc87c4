"""OpenAI shapes for engines that generate tokens themselves (the embedded engine), and the
one OpenAI error object every layer answers with.

Pure builders: the error object, chat messages normalised for a chat template, chat/
completion bodies and stream chunks, and an incremental detokenizer that holds back an
incomplete UTF-8 character instead of emitting a replacement mark.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engines.base import Endpoint

_SEP = b"\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + _SEP


DONE = b"data: [DONE]\n\n"


def error_object(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, dict[str, str | None]]:
    """The OpenAI error body ``{"error": {"message", "type", "param", "code"}}``.

    ``type`` is ``invalid_request_error`` for the client's mistakes and ``server_error``
    otherwise; ``param`` names the offending field (``messages[0].content``).
    """
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class MessageError(ValueError):
    """A chat message this engine cannot render; ``param`` names it (for a 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


# Roles a chat template is given: OpenAI's developer is a system turn; tool results (and
# the deprecated function results) go into a user turn, as Qwen3's template renders them.
_TEMPLATE_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "user",
    "function": "user",
}
CHAT_ROLES = frozenset(_TEMPLATE_ROLES)  # every role an OpenAI chat message may have
_MEDIA_PARTS = frozenset({"image_url", "input_image", "input_audio", "audio_url", "file"})


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """OpenAI chat messages as ``{"role", "content"}`` pairs of strings for a chat template.

    Roles come out as system, user or assistant only, so any template renders them: text
    parts are joined with newlines (as vLLM does), null or missing content is "", assistant
    ``tool_calls`` and ``tool``/``function`` results are written as Hermes-style
    ``<tool_call>``/``<tool_response>`` text. Raises MessageError naming the param for an
    unknown role, an image/audio/file part ("this model is text-only") or a malformed part.
    """
    return [_template_message(i, m) for i, m in enumerate(messages)]


def _template_message(i: int, message: Mapping[str, Any]) -> dict[str, str]:
    where = f"messages[{i}]"
    role = message.get("role")
    target_role = _TEMPLATE_ROLES.get(role) if isinstance(role, str) else None
    if target_role is None:
        raise MessageError(f"'{where}.role' {role!r} is not a chat role", f"{where}.role")
    text = _content_text(f"{where}.content", message.get("content"))
    if role in ("tool", "function"):
        text = f"<tool_response>\n{text}\n</tool_response>"
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        rendered = [_tool_call_text(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(calls)]
        text = "\n".join([text, *rendered] if text else rendered)
    return {"role": target_role, "content": text}


def _content_text(param: str, content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise MessageError(f"'{param}' must be a string, an array of parts or null", param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        payload = part.get(kind) if isinstance(part, Mapping) and kind else None
        if kind in ("text", "refusal") and isinstance(payload, str):
            texts.append(payload)
        elif kind in _MEDIA_PARTS:
            raise MessageError(
                f"'{param}[{j}]' is an {kind!r} part: this model is text-only; "
                "send text parts or a string",
                f"{param}[{j}]",
            )
        else:
            raise MessageError(
                f'\'{param}[{j}]\' must be a text part {{"type": "text", "text": ...}}',
                f"{param}[{j}]",
            )
    return "\n".join(texts)


def _tool_call_text(param: str, call: Any) -> str:
    function = call.get("function") if isinstance(call, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str):
        raise MessageError(f"'{param}.function.name' must be a string", f"{param}.function.name")
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments  # not JSON: written as the string the client sent
    call_json = json.dumps({"name": name, "arguments": parsed}, ensure_ascii=False)
    return f"<tool_call>\n{call_json}\n</tool_call>"


class ResponseShape:
    """Builds the bodies and chunks of one response (one id, one creation time)."""

    def __init__(self, endpoint: Endpoint, model: str) -> None:
        self.endpoint = endpoint
        self.model = model
        prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text: str, finish_reason: str | None, is_first: bool = False) -> dict[str, Any]:
        if self.endpoint == "chat":
            delta: dict[str, Any] = {"content": text}
            if is_first:
                delta = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta}
            obj = "chat.completion.chunk"
        else:
            choice, obj = {"index": 0, "text": text}, "text_completion"
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        return {**self._head(obj), "choices": [choice]}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage}

    def body(self, text: str, finish_reason: str | None, usage: dict[str, int]) -> dict[str, Any]:
        if self.endpoint == "chat":
            message = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"index": 0, "message": message}
            obj = "chat.completion"
        else:
            choice, obj = {"index": 0, "text": text}, "text_completion"
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        return {**self._head(obj), "choices": [choice], "usage": usage}


def usage(num_prompt: int, num_output: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_output,
        "total_tokens": num_prompt + num_output,
    }


class Detokenizer:
    """Turns a growing list of token ids into text deltas; honours stop strings."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # text emitted so far
        self.is_stopped = False

    def add(self, token_ids: list[int], is_last: bool) -> str:
        """The new text these tokens complete (stops at the first stop string)."""
        self.ids.extend(token_ids)
        full = self._decode(self.ids)
        if full.endswith("\ufffd") and not is_last:
            return ""  # part of a multi-byte character: wait for the rest
        for stop in self._stop:
            cut = full.find(stop, max(0, len(self.text) - len(stop)))
            if cut >= 0:
                full, self.is_stopped = full[:cut], True
        delta = full[len(self.text) :]
        self.text = full if len(full) > len(self.text) else self.text
        return delta
