"""The admin HTTP API for the policy: read, validate, apply, list versions, roll back.

    GET  /admin/policy                 current YAML; ETag and X-Draftctl-Policy-Version headers
    PUT  /admin/policy                 YAML body; If-Match honoured (412); 200 {"version": N}
                                       or 422 {"errors": [{"path", "message", "line"}], "error"}
    POST /admin/policy/validate        YAML body; 200 {"ok": bool, "errors": [...]} (never applies)
    GET  /admin/policy/versions        {"current": N, "versions": [...newest first], "file": {...}}
    GET  /admin/policy/versions/{n}    that version's YAML
    POST /admin/policy/rollback        {"version": N}; 200 {"version": new, "rolled_back_to": N}
    POST /admin/policy/whatif          YAML body; the edit replayed on the recorded traffic
                                       (controller/whatif.py; needs recording.enabled)

PUT and validate answer from the same ``validate_and_build`` as the file watcher and
``draftctl config check``: a policy that cannot be built (e.g. a goodput ``cost_table`` that
cannot be read) is a 422 and changes nothing. Bodies are read up to ``MAX_POLICY_BYTES``
(413 past it); parsing, building and writing run on a worker thread, never on the event loop.
Every route goes through ``AdminAuth`` first (see admin_auth). Every error, an unexpected one
too, is JSON in the OpenAI shape. Mount with ``admin_routes``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from controller.admin_auth import AdminAuth
from controller.openai_errors import ApiError
from controller.policy.document import MAX_POLICY_BYTES
from controller.policy.store import PolicyStore, PreconditionFailed, UnknownVersion
from policies.validation import InvalidDocument

__all__ = ["AdminAuth", "admin_routes"]

log = logging.getLogger(__name__)

YAML_MEDIA_TYPE = "application/yaml; charset=utf-8"
# Version numbers are small; a longer path segment is not one (and int() of a huge one fails).
_MAX_VERSION_DIGITS = 12

Endpoint = Callable[[Request], Awaitable[Response]]


def _json(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    # ASCII-escaped: a lone surrogate echoed from a body (e.g. a YAML key "\ud800") cannot
    # make the encoder fail.
    data = json.dumps(body).encode("ascii")
    return Response(data, status_code=status, media_type="application/json", headers=headers)


def _error(status: int, message: str, code: str, **headers: str) -> Response:
    response = ApiError(status, message, code=code).response()
    response.headers.update(headers)
    return response


def _invalid(exc: InvalidDocument) -> Response:
    errors = [p.as_dict() for p in exc.problems]
    summary = f"the policy is invalid: {exc}; fix the listed keys and retry"
    error = ApiError(422, summary, code="invalid_policy").body()["error"]
    return _json({"ok": False, "errors": errors, "error": error}, status=422)


async def _read_body(request: Request) -> bytes:
    data = bytearray()
    async for chunk in request.stream():
        data.extend(chunk)
        if len(data) > MAX_POLICY_BYTES:
            raise ApiError(
                413,
                f"policy body is over {MAX_POLICY_BYTES} bytes; send a smaller document",
                code="too_large",
            )
    return bytes(data)


async def read_text(request: Request) -> str:
    try:
        return (await _read_body(request)).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400,
            f"body is not UTF-8 text (bad byte at offset {exc.start}); send UTF-8",
            code="bad_encoding",
        ) from None


def _parse_json(text: str) -> Any:
    """``json.loads`` whose every failure is a 400: syntax, nesting past the parser's
    recursion limit, integers past Python's 4,300-digit limit."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        # (Python's advice to raise its integer digit limit is not for clients.)
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise ApiError(
            400, f'body is not valid JSON ({reason}); send {{"version": N}}', code="bad_json"
        ) from None


async def _read_version_json(request: Request) -> int:
    body = _parse_json(await read_text(request))
    version = body.get("version") if isinstance(body, dict) else None
    if not isinstance(version, int) or isinstance(version, bool):
        shown = repr(body)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise ApiError(
            400,
            f'body needs an integer "version", got {shown}; send {{"version": N}}',
            code="bad_version",
        )
    return version


class AdminAPI:
    """Endpoints bound to one store; every handler runs behind the auth check."""

    def __init__(self, store: PolicyStore, auth: AdminAuth):
        self._store = store
        self._auth = auth

    def guarded(self, handler: Endpoint) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            denied = self._auth.check(request)
            if denied is not None:
                return denied
            try:
                return await handler(request)
            except ApiError as exc:
                return exc.response()
            except OSError as exc:  # the store builds before writing: nothing was activated
                log.error("policy write failed: %s", exc)
                message = (
                    f"could not write the policy ({exc}); the running policy is unchanged. "
                    "Check free space and permissions of policy.path and policy.versions_dir"
                )
                return ApiError(500, message, type="server_error", code="write_failed").response()
            except Exception:
                log.exception("admin %s %s failed", request.method, request.url.path)
                message = "internal error in the admin API (logged); the running policy stays"
                return ApiError(500, message, type="server_error", code="internal").response()

        return endpoint

    def _version_headers(self) -> dict[str, str]:
        version = self._store.current()[0]
        return {"ETag": self._store.etag(), "X-Draftctl-Policy-Version": str(version)}

    async def get_policy(self, request: Request) -> Response:
        _, text, _ = self._store.current()
        return Response(text, media_type=YAML_MEDIA_TYPE, headers=self._version_headers())

    async def put_policy(self, request: Request) -> Response:
        text = await read_text(request)
        if_match = request.headers.get("if-match")
        try:
            version = await asyncio.to_thread(self._store.apply, text, if_match)
        except InvalidDocument as exc:
            return _invalid(exc)
        except PreconditionFailed as exc:
            return _error(412, str(exc), "etag_mismatch", ETag=exc.current_etag)
        body = {"version": version, "etag": self._store.etag()}
        return _json(body, headers=self._version_headers())

    async def validate_policy(self, request: Request) -> Response:
        # 200 either way: the question "is this valid?" was answered. Only PUT refuses (422).
        text = await read_text(request)
        try:
            built = await asyncio.to_thread(self._store.build, text)
        except InvalidDocument as exc:
            return _json({"ok": False, "errors": [p.as_dict() for p in exc.problems]})
        return _json({"ok": True, "errors": [], "kind": built.spec.kind})

    async def list_versions(self, request: Request) -> Response:
        store = self._store
        problems = store.last_file_error
        file_status: dict[str, Any] = {
            "path": str(store.path),
            "num_rejected_changes": store.num_rejected_file_changes,
            "last_error": None if problems is None else [p.as_dict() for p in problems],
        }
        body = {"current": store.current()[0], "versions": store.versions(), "file": file_status}
        return _json(body, headers=self._version_headers())

    async def get_version(self, request: Request) -> Response:
        raw = request.path_params["version"]
        if not (raw.isascii() and raw.isdigit() and len(raw) <= _MAX_VERSION_DIGITS):
            return _error(
                404, f"policy version {raw[:40]!r} is not kept; see GET versions", "unknown_version"
            )
        try:
            text = self._store.version_text(int(raw))
        except UnknownVersion as exc:
            return _error(404, str(exc), "unknown_version")
        return Response(text, media_type=YAML_MEDIA_TYPE)

    async def rollback(self, request: Request) -> Response:
        target = await _read_version_json(request)
        if_match = request.headers.get("if-match")
        try:
            version = await asyncio.to_thread(self._store.rollback, target, if_match)
        except UnknownVersion as exc:
            return _error(404, str(exc), "unknown_version")
        except InvalidDocument as exc:  # an old version the current code no longer accepts
            return _invalid(exc)
        except PreconditionFailed as exc:
            return _error(412, str(exc), "etag_mismatch", ETag=exc.current_etag)
        body = {"version": version, "rolled_back_to": target, "etag": self._store.etag()}
        return _json(body, headers=self._version_headers())


def admin_routes(
    store: PolicyStore, auth: AdminAuth, api: AdminAPI | None = None
) -> list[BaseRoute]:
    """The admin API's routes, ready to mount on the daemon's Starlette app."""
    api = api or AdminAPI(store, auth)
    g = api.guarded
    return [
        Route("/admin/policy", g(api.get_policy), methods=["GET"]),
        Route("/admin/policy", g(api.put_policy), methods=["PUT"]),
        Route("/admin/policy/validate", g(api.validate_policy), methods=["POST"]),
        Route("/admin/policy/versions", g(api.list_versions), methods=["GET"]),
        Route("/admin/policy/versions/{version}", g(api.get_version), methods=["GET"]),
        Route("/admin/policy/rollback", g(api.rollback), methods=["POST"]),
    ]
