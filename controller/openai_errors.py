"""OpenAI-style error responses: ``{"error": {"message", "type", "param", "code"}}``.

Every message names the bad input and, where it helps, what to do instead. The body itself
is built by engines.openai_format.error_object, the one builder every layer uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from starlette.responses import Response

from engines.openai_format import error_object


@dataclass(frozen=True)
class ApiError(Exception):
    """An error the client caused or must see; rendered as an OpenAI error body."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    # Extra response headers (Retry-After on a 429).
    headers: tuple[tuple[str, str], ...] = ()

    def body(self) -> dict[str, dict[str, str | None]]:
        return error_object(self.message, self.type, self.param, self.code)

    def body_bytes(self) -> bytes:
        return json.dumps(self.body()).encode()

    def response(self) -> Response:
        return Response(
            self.body_bytes(),
            status_code=self.status,
            headers=dict(self.headers),
            media_type="application/json",
        )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str, known: list[str]) -> ApiError:
    return ApiError(
        404,
        f"The model {model!r} does not exist here; served models: {', '.join(known)}",
        param="model",
        code="model_not_found",
    )


def body_too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413,
        f"Request body of {size} bytes exceeds server.max_body_bytes = {limit}; "
        "send a smaller request or raise the limit in the config",
        code="request_too_large",
    )


def no_backend(model: str) -> ApiError:
    return ApiError(
        503,
        f"No healthy backend for model {model!r} right now; retry shortly",
        type="server_error",
        code="backend_unavailable",
    )


def timeout_error(limit_s: float) -> ApiError:
    return ApiError(
        504,
        f"The request ran longer than server.request_timeout_s = {limit_s} s and was stopped",
        type="server_error",
        code="timeout",
    )


def too_busy(num_inflight: int, retry_after_s: int) -> ApiError:
    return ApiError(
        429,
        f"draftctl already has {num_inflight} requests in flight (server.max_inflight); "
        f"retry in {retry_after_s} s",
        type="requests",  # what OpenAI's own 429s say
        code="rate_limit_exceeded",
        headers=(("retry-after", str(retry_after_s)),),
    )


def read_timeout(what: str, limit_s: float) -> ApiError:
    return ApiError(
        408,
        f"The request {what} did not arrive within server.{what}_timeout_s = {limit_s} s",
        code="request_timeout",
    )


def shutting_down() -> ApiError:
    return ApiError(
        503,
        "draftctl is shutting down and stopped this request at server.drain_timeout_s; "
        "retry on another instance",
        type="server_error",
        code="shutting_down",
    )
