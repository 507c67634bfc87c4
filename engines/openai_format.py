"""OpenAI response shapes for engines that generate tokens themselves (the embedded engine).

Pure builders: chat/completion bodies and stream chunks, and an incremental detokenizer that
holds back an incomplete UTF-8 character instead of emitting a replacement mark.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from engines.base import Endpoint

_SEP = b"\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + _SEP


DONE = b"data: [DONE]\n\n"


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
