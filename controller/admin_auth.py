"""Who may call the admin API.

With a token configured (the environment variable named by config ``admin.token_env``,
default ``DRAFTCTL_ADMIN_TOKEN``), every admin call needs ``Authorization: Bearer <token>``,
compared in constant time. Without a token the admin API answers loopback clients only, so a
daemon bound to a public address never exposes an unauthenticated policy editor.

"Loopback client" means the peer is loopback *and* every client a proxy says it forwarded
for is loopback too: a reverse proxy on the same host passes remote clients over a loopback
connection and names them in ``X-Forwarded-For`` or in RFC 7239 ``Forwarded: for=...``.
A node the proxy hides (``unknown``, ``_obfuscated``), a ``Forwarded`` element without
``for=``, or a header that does not parse counts as a remote client.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from controller.openai_errors import ApiError

DEFAULT_TOKEN_ENV = "DRAFTCTL_ADMIN_TOKEN"

# One ``key=value`` pair of a Forwarded element; the value a token or a quoted-string
# (RFC 7239 section 4), followed by the separator (";" within an element, "," between them).
_FORWARDED_PAIR = re.compile(
    r'\s*([A-Za-z0-9!#$%&\'*+.^_`|~-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;,"]*)\s*([;,]|$)'
)


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


def forwarded_for(values: Iterable[str]) -> list[str | None]:
    """The ``for=`` node of every element of RFC 7239 ``Forwarded`` header values, in order
    (None for an element without one). Raises ValueError when a value does not parse."""
    nodes: list[str | None] = []
    for value in values:
        node: str | None = None
        position, end = 0, len(value.rstrip())
        while position < end:
            match = _FORWARDED_PAIR.match(value, position)
            if match is None or match.end() == position:
                raise ValueError(f"Forwarded header does not parse at {value[position:]!r}")
            key, raw, separator = match.groups()
            if key.lower() == "for":
                node = re.sub(r"\\(.)", r"\1", raw[1:-1]) if raw.startswith('"') else raw
            if separator != ";":
                nodes.append(node)
                node = None
            position = match.end()
    return nodes


def node_host(node: str) -> str:
    """The address in a forwarded-for node: ``"[::1]:4711"`` -> ``::1``, ``1.2.3.4:80`` ->
    ``1.2.3.4``."""
    node = node.strip()
    if node.startswith("[") and "]" in node:
        return node[1 : node.index("]")]
    if node.count(":") == 1:  # an IPv4 address with a port
        return node.split(":", 1)[0]
    return node


def forwarded_clients(request: Request) -> list[str | None]:
    """Every client a proxy says this request was forwarded for (None: one it did not name)."""
    clients: list[str | None] = []
    try:
        nodes = forwarded_for(request.headers.getlist("forwarded"))
        clients.extend(None if node is None else node_host(node) for node in nodes)
    except ValueError:
        clients.append(None)
    for value in request.headers.getlist("x-forwarded-for"):
        clients.extend(node_host(part) for part in value.split(",") if part.strip())
    return clients


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
        peer = request.client.host if request.client else None
        remote = [c for c in [peer, *forwarded_clients(request)] if not is_loopback(c)]
        if not remote:
            return None
        return ApiError(
            403,
            f"the admin API answers only loopback clients when no token is set (you are "
            f"{(remote[0] or 'an unnamed forwarded client')[:80]}); set {self.token_env} on the "
            "daemon and send 'Authorization: Bearer <token>'",
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
