"""The admin HTTP API for the policy: read, validate, apply, list versions, roll back.

    GET  /admin/policy                 current YAML; ETag and X-Draftctl-Policy-Version headers
    PUT  /admin/policy                 YAML body; If-Match honoured (412); 200 {"version": N}
                                       or 422 {"errors": [{"path", "message", "line"}]}
    POST /admin/policy/validate        YAML body; 200 {"ok": bool, "errors": [...]} (never applies)
    GET  /admin/policy/versions        {"current": N, "versions": [...newest first], "file": {...}}
    GET  /admin/policy/versions/{n}    that version's YAML
    POST /admin/policy/rollback        {"version": N}; 200 {"version": new, "rolled_back_to": N}

Every route goes through ``AdminAuth`` first (see admin_auth). Mount with ``admin_routes``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from controller.admin_auth import AdminAuth
from controller.openai_errors import ApiError
from controller.policy_store import (
    PolicyStore,
    PreconditionFailed,
    UnknownVersion,
    validate_policy_text,
)
from policies.validation import InvalidDocument

__all__ = ["AdminAuth", "admin_routes"]

log = logging.getLogger(__name__)

MAX_POLICY_BYTES = 256 * 1024
YAML_MEDIA_TYPE = "application/yaml; charset=utf-8"

Endpoint = Callable[[Request], Awaitable[Response]]


def _error(status: int, message: str, code: str, **headers: str) -> Response:
    response = ApiError(status, message, code=code).response()
    response.headers.update(headers)
    return response


def _invalid(exc: InvalidDocument) -> JSONResponse:
    errors = [p.as_dict() for p in exc.problems]
    summary = f"the policy is invalid: {exc}; fix the listed keys and retry"
    body = {
        "ok": False,
        "errors": errors,
        "error": {
            "message": summary,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_policy",
        },
    }
    return JSONResponse(body, status_code=422)


async def _read_text(request: Request) -> str:
    data = bytearray()
    async for chunk in request.stream():
        data.extend(chunk)
        if len(data) > MAX_POLICY_BYTES:
            raise ApiError(
                413,
                f"policy body is over {MAX_POLICY_BYTES} bytes; send a smaller document",
                code="too_large",
            )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(
            400, "policy body is not UTF-8 text; send YAML as UTF-8", code="bad_encoding"
        ) from None


async def _read_version_json(request: Request) -> int:
    text = await _read_text(request)
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, f'body is not JSON ({exc}); send {{"version": N}}', code="bad_json"
        ) from None
    version = body.get("version") if isinstance(body, dict) else None
    if not isinstance(version, int) or isinstance(version, bool):
        raise ApiError(
            400,
            f'body needs an integer "version", got {body!r}; send {{"version": N}}',
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
            except OSError as exc:  # the store validates before writing: nothing was activated
                log.error("policy write failed: %s", exc)
                message = (
                    f"could not write the policy ({exc}); the running policy is unchanged. "
                    "Check free space and permissions of policy.path and policy.versions_dir"
                )
                return ApiError(500, message, type="server_error", code="write_failed").response()

        return endpoint

    def _version_headers(self) -> dict[str, str]:
        version = self._store.current()[0]
        return {"ETag": self._store.etag(), "X-Draftctl-Policy-Version": str(version)}

    async def get_policy(self, request: Request) -> Response:
        _, text, _ = self._store.current()
        return Response(text, media_type=YAML_MEDIA_TYPE, headers=self._version_headers())

    async def put_policy(self, request: Request) -> Response:
        text = await _read_text(request)
        try:
            version = self._store.apply(text, if_match=request.headers.get("if-match"))
        except InvalidDocument as exc:
            return _invalid(exc)
        except PreconditionFailed as exc:
            return _error(412, str(exc), "etag_mismatch", ETag=exc.current_etag)
        body = {"version": version, "etag": self._store.etag()}
        return JSONResponse(body, headers=self._version_headers())

    async def validate_policy(self, request: Request) -> Response:
        # 200 either way: the question "is this valid?" was answered. Only PUT refuses (422).
        text = await _read_text(request)
        try:
            spec = validate_policy_text(text)
        except InvalidDocument as exc:
            return JSONResponse({"ok": False, "errors": [p.as_dict() for p in exc.problems]})
        return JSONResponse({"ok": True, "errors": [], "kind": spec.kind})

    async def list_versions(self, request: Request) -> Response:
        store = self._store
        problems = store.last_file_error
        file_status: dict[str, Any] = {
            "path": str(store.path),
            "num_rejected_changes": store.num_rejected_file_changes,
            "last_error": None if problems is None else [p.as_dict() for p in problems],
        }
        body = {"current": store.current()[0], "versions": store.versions(), "file": file_status}
        return JSONResponse(body, headers=self._version_headers())

    async def get_version(self, request: Request) -> Response:
        version = int(request.path_params["version"])
        try:
            text = self._store.version_text(version)
        except UnknownVersion as exc:
            return _error(404, str(exc), "unknown_version")
        return Response(text, media_type=YAML_MEDIA_TYPE)

    async def rollback(self, request: Request) -> Response:
        target = await _read_version_json(request)
        try:
            version = self._store.rollback(target, if_match=request.headers.get("if-match"))
        except UnknownVersion as exc:
            return _error(404, str(exc), "unknown_version")
        except InvalidDocument as exc:  # an old version the current code no longer accepts
            return _invalid(exc)
        except PreconditionFailed as exc:
            return _error(412, str(exc), "etag_mismatch", ETag=exc.current_etag)
        body = {"version": version, "rolled_back_to": target, "etag": self._store.etag()}
        return JSONResponse(body, headers=self._version_headers())


def admin_routes(store: PolicyStore, auth: AdminAuth) -> list[BaseRoute]:
    """The admin API's routes, ready to mount on the daemon's Starlette app."""
    api = AdminAPI(store, auth)
    g = api.guarded
    return [
        Route("/admin/policy", g(api.get_policy), methods=["GET"]),
        Route("/admin/policy", g(api.put_policy), methods=["PUT"]),
        Route("/admin/policy/validate", g(api.validate_policy), methods=["POST"]),
        Route("/admin/policy/versions", g(api.list_versions), methods=["GET"]),
        Route("/admin/policy/versions/{version:int}", g(api.get_version), methods=["GET"]),
        Route("/admin/policy/rollback", g(api.rollback), methods=["POST"]),
    ]
