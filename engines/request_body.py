"""The body a pool sends upstream: the client's bytes with draftctl's few fields spliced in.

A pool adds at most two top-level fields to the client's request: ``stream_options`` with
``include_usage`` (per-request speculation metrics ride on the usage chunk) and the backend's
own reporting switch (SGLang's ``return_spec_tokens_details``). Re-encoding the whole parsed
body for that costs time in proportion to the request (~190 us for an 87 KB multi-turn chat
with the stdlib encoder on this project's 2-core machine), so when none of the added keys is
already in the body, the new fields are written after the client's opening brace and the
rest of its bytes go out as they came. Anything else (a key to overwrite, a body that was
changed after parsing, bytes that are not UTF-8 JSON) is encoded again from the parsed body.
"""

from __future__ import annotations

from typing import Any

import orjson

_WHITESPACE = b" \t\r\n"


def upstream_body(
    body: dict[str, Any], raw: bytes | None, extras: dict[str, Any], is_stream: bool
) -> tuple[bytes, bool]:
    """(the bytes to send upstream, whether the client itself asked for the usage chunk).

    ``body`` is the parsed request as it should be forwarded; ``raw`` its bytes as the
    client sent them, or None when ``body`` no longer matches them.
    """
    added = dict(extras)
    wants_usage = False
    if is_stream:
        options = body.get("stream_options")
        wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        if not wants_usage:
            added["stream_options"] = {**(options or {}), "include_usage": True}
    start = -1 if raw is None else _object_start(raw)
    if raw is None or start < 0 or any(key in body for key in added):
        return orjson.dumps({**body, **added}), wants_usage
    if not added:
        return raw, wants_usage
    return _splice(raw, start, orjson.dumps(added)), wants_usage


def _object_start(raw: bytes) -> int:
    """Where the opening brace of ``raw`` is; -1 unless ``raw`` is plain UTF-8 JSON (not
    after a BOM, not UTF-16/32, which the stdlib parser accepts: they have NUL bytes)."""
    start = raw.find(b"{")
    if start < 0 or raw[:start].strip(_WHITESPACE) or b"\x00" in raw[: start + 4]:
        return -1
    return start


def _splice(raw: bytes, start: int, fields: bytes) -> bytes:
    """``raw`` (a JSON object opening at ``start``) with the members of ``fields`` (another
    JSON object) inserted first."""
    rest = raw[start + 1 :]
    if rest.lstrip(_WHITESPACE).startswith(b"}"):
        return b"{" + fields[1:-1] + rest  # an empty object: no comma
    return b"{" + fields[1:-1] + b"," + rest
