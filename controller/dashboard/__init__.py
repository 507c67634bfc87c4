"""The operator dashboard: one HTML page and a few hand-written JS/CSS files, all served here.

Nothing is loaded from a CDN; the Content-Security-Policy allows this origin only, so the page
works on air-gapped hosts and cannot pull in third-party code. The page reads ``/api/stats``
(served by the gateway) and the admin API (``controller.admin``). Mount ``dashboard_routes()``.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from controller.openai_errors import ApiError

ASSET_DIR = Path(__file__).parent

# The only files served; anything else under /dashboard/assets/ is a 404.
ASSETS: dict[str, str] = {
    "dashboard.css": "text/css; charset=utf-8",
    "main.js": "text/javascript; charset=utf-8",
    "stats.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "editor.js": "text/javascript; charset=utf-8",
    "admin_client.js": "text/javascript; charset=utf-8",
}

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate every load so a daemon upgrade never runs stale JS against a new API.
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return (ASSET_DIR / name).read_bytes()


async def page(request: Request) -> Response:
    return Response(
        _read("index.html"), media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS
    )


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    media_type = ASSETS.get(name)
    if media_type is None:
        known = ", ".join(sorted(ASSETS))
        return ApiError(
            404, f"no dashboard asset {name!r}; served: {known}", code="not_found"
        ).response()
    return Response(_read(name), media_type=media_type, headers=SECURITY_HEADERS)


async def to_page(request: Request) -> Response:
    return RedirectResponse("/dashboard", status_code=308)


def dashboard_routes() -> list[BaseRoute]:
    """GET /dashboard and its assets, ready to mount on the daemon's Starlette app."""
    return [
        Route("/dashboard", page, methods=["GET", "HEAD"]),
        Route("/dashboard/", to_page, methods=["GET", "HEAD"]),
        Route("/dashboard/assets/{name}", asset, methods=["GET", "HEAD"]),
    ]
