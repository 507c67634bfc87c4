"""Pass an OpenAI SSE stream through, rewriting only the chunks draftctl must touch.

Almost every event is a content chunk with ``"finish_reason":null``; those bytes go out
untouched, a whole upstream read at a time. Only three kinds of event are parsed:

- a chunk with a finish_reason: held back until the next event, so that the last one can
  carry the ``draftctl`` object (the usage chunk that follows holds the acceptance numbers);
- the usage chunk (``choices: []`` plus ``usage``): the backend's per-request metrics are
  read from it; it is forwarded with ``draftctl`` if the client asked for usage, else dropped;
- ``[DONE]``: whatever is held goes out first, annotated if nothing was annotated yet.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

from engines.base import Annotator, Outcome
from engines.openai_format import error_object

# Reads a backend's per-request speculation metrics from a usage chunk or a full body.
OutcomeReader = Callable[[dict[str, Any]], Outcome | None]

_DONE = b"data: [DONE]"
_SEP = b"\n\n"


def merge_outcome(into: Outcome, found: Outcome | None, body: dict[str, Any]) -> None:
    """Copy reported metrics and usage token counts into ``into`` (in place)."""
    if found is not None:
        for name, value in vars(found).items():
            if value not in (None, []):
                setattr(into, name, value)
    usage = body.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        into.num_output_tokens = usage["completion_tokens"]
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        into.num_prompt_tokens = usage["prompt_tokens"]


# Byte patterns that mark an event draftctl must look into: a finish_reason that is a string,
# a usage object, the end of the stream. Anything else passes through unparsed.
_MARKERS = (
    b'"finish_reason":"',
    b'"finish_reason": "',
    b'"usage":{',
    b'"usage": {',
    _DONE,
)
# Upstreams that write compact JSON (vLLM and SGLang serialise with pydantic) need only the
# compact spellings: three scans of every relayed read instead of five.
_COMPACT_MARKERS = (b'"finish_reason":"', b'"usage":{', _DONE)


def _json_style_markers(event: bytes) -> tuple[bytes, ...] | None:
    """The markers for the upstream that wrote ``event``; None if it does not tell.

    A JSON event without ``": `` anywhere was written compactly, and so will the rest of the
    stream be (one serialiser). A compact event whose text happens to contain ``": `` only
    costs the two extra scans.
    """
    if not event.startswith(b"data: {") or b'":' not in event:
        return None
    return _MARKERS if b'": ' in event else _COMPACT_MARKERS


def _first_marker(block: bytes, markers: tuple[bytes, ...] = _MARKERS) -> int:
    """Offset of the first marker in ``block``, -1 if none (the hot path: no JSON parsing).

    Each search after a hit only scans up to that hit; no list or generator per call.
    """
    first = -1
    for marker in markers:
        # One-argument find() until a hit: bounds cost an argument-parsing call per search.
        i = block.find(marker) if first < 0 else block.find(marker, 0, first)
        if i >= 0:
            first = i
    return first


class SseAnnotator:
    """Incremental rewriter for one response stream; feed upstream reads, send what it returns."""

    def __init__(self, annotate: Annotator, read_outcome: OutcomeReader, wants_usage: bool) -> None:
        self.outcome = Outcome()
        self._annotate = annotate
        self._read_outcome = read_outcome
        self._wants_usage = wants_usage
        self._pending = b""
        # The held chunk with a finish_reason: its parsed object and its bytes as received.
        self._held: tuple[dict[str, Any], bytes] | None = None
        self._is_annotated = False
        self.is_done = False
        self._markers: tuple[bytes, ...] | None = None  # until the first event shows the style

    def feed(self, data: bytes) -> bytes:
        markers = self._markers
        if markers is None:
            markers = self._learn_style(data)
        if not self._pending and self._held is None and data.endswith(_SEP):
            # The common read: whole events, nothing held. Pass it on if it has no marker.
            if _first_marker(data, markers) < 0:
                return data
        buffer = self._pending + data if self._pending else data
        end = buffer.rfind(_SEP)
        if end < 0:
            self._pending = buffer
            return b""
        end += len(_SEP)
        complete, self._pending = buffer[:end], buffer[end:]
        head, tail = b"", complete
        if self._held is None:
            cut = _first_marker(complete, markers)
            if cut < 0:
                return complete
            start = complete.rfind(_SEP, 0, cut)
            start = 0 if start < 0 else start + len(_SEP)
            head, tail = complete[:start], complete[start:]
        return head + b"".join(self._event(e + _SEP) for e in tail.split(_SEP) if e.strip())

    def _learn_style(self, data: bytes) -> tuple[bytes, ...]:
        """Markers for this stream: compact ones once its first whole event is compact JSON."""
        buffer = self._pending + data if self._pending else data
        end = buffer.find(_SEP)
        found = _json_style_markers(buffer[:end]) if end >= 0 else None
        if found is not None:
            self._markers = found
            return found
        return _MARKERS

    def finish(self) -> bytes:
        """Upstream ended: flush anything held (annotated) and any partial event."""
        out = self._flush(annotate=not self._is_annotated)
        rest, self._pending = self._pending, b""
        return out + rest

    def finish_with_error(self, message: str) -> bytes:
        """The backend failed mid-stream: flush what is held, then an error event."""
        out = self._flush(annotate=False)
        self._pending = b""
        return out + error_event(message)

    def _event(self, event: bytes) -> bytes:
        if event.startswith(_DONE):
            self.is_done = True
            return self._flush(annotate=not self._is_annotated) + event
        obj = _json_data(event) if _first_marker(event, self._markers or _MARKERS) >= 0 else None
        if obj is None:
            return self._flush(annotate=False) + event
        if not obj.get("choices") and obj.get("usage"):
            return self._usage(obj, event)
        if any(c.get("finish_reason") is not None for c in obj.get("choices") or ()):
            merge_outcome(self.outcome, self._read_outcome(obj), obj)
            out = self._flush(annotate=False)
            self._held = (obj, event)
            return out
        return self._flush(annotate=False) + event

    def _usage(self, obj: dict[str, Any], event: bytes) -> bytes:
        merge_outcome(self.outcome, self._read_outcome(obj), obj)
        if not self._wants_usage:
            return b""
        out = self._flush(annotate=False)
        self._is_annotated = True
        return out + _with_draftctl(obj, event, self._annotate(self.outcome))

    def _flush(self, annotate: bool) -> bytes:
        if self._held is None:
            return b""
        (obj, event), self._held = self._held, None
        if not annotate:
            return event
        self._is_annotated = True
        return _with_draftctl(obj, event, self._annotate(self.outcome))


def error_event(message: str, code: str = "backend_error") -> bytes:
    """An SSE event carrying an OpenAI error object; the openai client raises APIError on it."""
    return b"data: " + json.dumps(error_object(message, "server_error", code=code)).encode() + _SEP


def _json_data(event: bytes) -> dict[str, Any] | None:
    if not event.startswith(b"data:"):
        return None
    try:
        obj = orjson.loads(event[5:])
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _with_draftctl(obj: dict[str, Any], event: bytes, annotation: dict[str, Any]) -> bytes:
    """``event`` (whose JSON is ``obj``) with a top-level ``draftctl`` object added."""
    spliced = with_draftctl_object(obj, event, annotation)
    if spliced is not None:
        return spliced + _SEP
    return b"data: " + orjson.dumps({**obj, "draftctl": annotation}) + _SEP


def with_draftctl_object(
    obj: dict[str, Any], data: bytes, annotation: dict[str, Any]
) -> bytes | None:
    """``data`` (bytes ending in the JSON of ``obj``) with ``"draftctl": annotation`` added
    as the object's last member; None when that cannot be done by splicing (``obj`` empty,
    already has the key, or ``data`` does not end with its closing brace).

    The upstream bytes are kept and only the annotation is encoded: re-encoding the whole
    body cost more than everything else the final chunk needs.
    """
    data = data.rstrip()
    if not obj or "draftctl" in obj or not data.endswith(b"}"):
        return None
    return data[:-1] + b',"draftctl":' + orjson.dumps(annotation) + b"}"
