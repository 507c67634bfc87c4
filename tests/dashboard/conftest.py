"""Browser fixtures: Debian's Chromium driven by Playwright, and servers on loopback.

Playwright never downloads a browser here: it launches ``/usr/bin/chromium`` (installed by
``scripts/install_browser.sh``; override with DRAFTCTL_CHROMIUM). Screenshots land in
``artifacts/dashboard/`` (git-ignored) so CI can keep them.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.types import ASGIApp

CHROMIUM = Path(os.environ.get("DRAFTCTL_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "dashboard"


@contextmanager
def serve(app: ASGIApp) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free loopback port in a thread; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "test server did not start within 10 s"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


# Module scope, not session: Playwright's sync API keeps an event loop running in this thread
# while it is open, which would break asyncio tests collected after these modules.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: run scripts/install_browser.sh (make browser-deps)")
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield browser
        browser.close()


class PageWatch:
    """Console errors, uncaught exceptions and every URL a page requested."""

    def __init__(self, page: Any):
        self.errors: list[str] = []
        self.urls: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("request", lambda request: self.urls.append(request.url))

    def _console(self, message: Any) -> None:
        if message.type in ("error", "assert"):
            self.errors.append(f"console.{message.type}: {message.text}")


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.watch = PageWatch(page)  # type: ignore[attr-defined]
    yield page
    context.close()


def _screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture
def serve_app() -> Any:
    """``with serve_app(app) as base_url:`` runs an ASGI app on loopback."""
    return serve


@pytest.fixture
def screenshot() -> Any:
    """``screenshot(page, name)`` saves a full-page PNG under artifacts/dashboard/."""
    return _screenshot
