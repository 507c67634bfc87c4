"""Reading a completion request's head fields and body straight off ASGI (no Starlette
Request on the hot path), within ``server.max_body_bytes``.

How long a client may take to send them is bounded below this, per connection, by
controller/http_protocol.py (``server.header_timeout_s``, ``server.body_timeout_s``).
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope

from controller.openai_errors import bad_request, body_too_large
from controller.request_parse import TASK_HEADER

_TASK_HEADER = TASK_HEADER.encode()


def request_headers(scope: Scope) -> tuple[str | None, str | None]:
    """(x-draftctl-task, content-length) from the ASGI scope's lower-cased raw headers."""
    task = length = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = value.decode("latin-1")
        elif name == _TASK_HEADER:
            task = value.decode("latin-1")
    return task, length


def check_length(length_header: str | None, limit: int) -> None:
    """Reject by Content-Length before reading the body (the read itself is capped too)."""
    if length_header is None:
        return
    try:
        size = int(length_header)
    except ValueError:
        raise bad_request(f"Content-Length {length_header!r} is not an integer") from None
    if size > limit:
        raise body_too_large(size, limit)


async def read_body(receive: Receive, length_header: str | None, limit: int) -> bytes:
    """The whole body; ApiError when it is empty or over ``limit`` bytes, ClientDisconnect
    when the client leaves first."""
    check_length(length_header, limit)
    chunks: list[bytes] = []
    size = 0
    more_body = True
    while more_body:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        more_body = message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            raise body_too_large(size, limit)
        chunks.append(chunk)
    if not size:
        raise bad_request("Request body is empty; send a JSON object")
    return b"".join(chunks)
