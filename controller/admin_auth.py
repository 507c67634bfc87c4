"""Who may call the admin API.

With a token configured (the environment variable named by config ``admin.token_env``,
default ``DRAFTCTL_ADMIN_TOKEN``), every admin call needs ``Authorization: Bearer <token>``,
compared in constant time. Without a token the admin API answers loopback clients only, so a
daemon bound to a public address never exposes an unauthenticated policy editor.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from controller.openai_errors import ApiError

DEFAULT_TOKEN_ENV = "DRAFTCTL_ADMIN_TOKEN"


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


@dataclass(frozen=True)
class AdminAuth:
    token: str | None
    token_env: str = DEFAULT_TOKEN_ENV

    @classmethod
    def from_env(
        cls, token_env: str = DEFAULT_TOKEN_ENV, environ: Mapping[str, str] | None = None
    ) -> AdminAuth:
        value = (os.environ if environ is None else environ).get(token_env, "")
        return cls(token=value or None, token_env=token_env)

    def check(self, request: Request) -> Response | None:
        """None when the request may proceed, else the 401/403 response to send."""
        if self.token is not None:
            return self._check_token(request.headers.get("authorization", ""))
        host = request.client.host if request.client else None
        if is_loopback(host):
            return None
        return ApiError(
            403,
            f"the admin API answers only loopback clients when no token is set (you are {host}); "
            f"set {self.token_env} on the daemon and send 'Authorization: Bearer <token>'",
            type="permission_error",
            code="admin_loopback_only",
        ).response()

    def _check_token(self, header: str) -> Response | None:
        scheme, _, presented = header.partition(" ")
        assert self.token is not None, "token checks need a configured token"
        if scheme.lower() == "bearer" and hmac.compare_digest(
            presented.strip().encode("utf-8"), self.token.encode("utf-8")
        ):
            return None
        problem = "missing" if not header else "wrong"
        response = ApiError(
            401,
            f"admin token {problem}: send 'Authorization: Bearer <token>' with the value of "
            f"{self.token_env} set on the daemon",
            type="authentication_error",
            code="invalid_admin_token",
        ).response()
        response.headers["WWW-Authenticate"] = 'Bearer realm="draftctl-admin"'
        return response
