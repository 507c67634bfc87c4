"""Periodic ``/metrics`` scrape of every server of every pool, feeding one window per server.

The scraper runs as one background task. A scrape that fails (connection refused, timeout,
HTTP error, malformed text) is recorded on that server's ``ScrapeStatus`` and logged once per
failure streak; nothing ever raises into the gateway, which reads only the latest windows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import aiohttp

from engines.prometheus_text import MetricsParseError
from engines.stats_window import CounterWindow, WindowStats, combine, parse_prometheus

log = logging.getLogger(__name__)


def metrics_url(server_url: str) -> str:
    """``http://host:port[/v1][/]`` -> ``http://host:port/metrics``."""
    base = server_url.rstrip("/")
    base = base.removesuffix("/v1")
    return f"{base}/metrics"


@dataclass
class ScrapeStatus:
    """How the scrapes of one server are going."""

    url: str
    is_ok: bool = False  # the latest scrape succeeded
    num_failures: int = 0  # consecutive failed scrapes
    last_error: str | None = None
    last_success_s: float | None = None


class MetricsScraper:
    """Scrapes each server URL every ``interval_s`` seconds into a ``window_s`` window."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        interval_s: float = 2.0,
        timeout_s: float = 2.0,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError(
                f"interval_s and timeout_s must be positive: {interval_s}, {timeout_s}"
            )
        self.interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock
        self._windows = {url: CounterWindow(window_s) for url in urls}
        self._status = {url: ScrapeStatus(url) for url in self._windows}
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Scrape once now, then every ``interval_s`` in the background."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        await self.scrape_once()
        self._task = asyncio.create_task(self._loop(), name="draftctl-metrics-scraper")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def scrape_once(self) -> None:
        """Scrape every server concurrently; failures are recorded, never raised."""
        await asyncio.gather(*(self._scrape(url) for url in self._windows))

    def stats(self, url: str) -> WindowStats | None:
        """One server's window (None before its first successful scrape or for unknown URLs)."""
        window = self._windows.get(url)
        return window.stats() if window is not None else None

    def pool_stats(self, urls: Sequence[str]) -> WindowStats | None:
        """A pool's window: its servers whose latest scrape succeeded, added up."""
        parts = [
            stats
            for url in urls
            if self._status.get(url, ScrapeStatus(url)).is_ok
            and (stats := self.stats(url)) is not None
        ]
        return combine(parts)

    def status(self, url: str) -> ScrapeStatus:
        return self._status.get(url, ScrapeStatus(url, last_error="not scraped: unknown URL"))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.scrape_once()
            except Exception:  # the loop must outlive any bug in one scrape
                log.exception("metrics scrape round failed")

    async def _scrape(self, url: str) -> None:
        status = self._status[url]
        try:
            text = await self._fetch(metrics_url(url))
            sample = parse_prometheus(text, self._clock())
        except (aiohttp.ClientError, TimeoutError, MetricsParseError, ValueError) as exc:
            self._record_failure(status, f"{type(exc).__name__}: {exc}")
            return
        self._windows[url].add(sample)
        status.is_ok, status.num_failures, status.last_error = True, 0, None
        status.last_success_s = sample.time_s

    async def _fetch(self, url: str) -> str:
        if self._session is None:
            raise aiohttp.ClientError("scraper is not started")
        async with self._session.get(url) as response:
            if response.status != 200:
                raise aiohttp.ClientError(f"GET {url} answered HTTP {response.status}")
            return await response.text()

    def _record_failure(self, status: ScrapeStatus, error: str) -> None:
        if status.num_failures == 0:
            log.warning("scraping %s failed: %s", metrics_url(status.url), error)
        status.is_ok, status.last_error = False, error
        status.num_failures += 1
