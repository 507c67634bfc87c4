"""The scraper against real HTTP servers on loopback: windows fill, failures are recorded."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from engines.scraper import MetricsScraper, metrics_url

PAGE = (Path(__file__).parent.parent / "fixtures" / "vllm" / "metrics_spec.txt").read_text()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
async def metrics_server() -> AsyncIterator[tuple[str, dict[str, str | int]]]:
    """A server whose /metrics page and status the test sets through the returned dict."""
    state: dict[str, str | int] = {"text": PAGE, "status": 200}

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=str(state["text"]), status=int(state["status"]))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/v1", state
    await runner.cleanup()


def test_metrics_url_strips_v1_and_slashes() -> None:
    assert metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000") == "http://h:8000/metrics"


async def test_windows_fill_from_successive_scrapes(
    metrics_server: tuple[str, dict[str, str | int]],
) -> None:
    url, state = metrics_server
    clock = FakeClock()
    scraper = MetricsScraper([url], interval_s=3600, timeout_s=2.0, clock=clock)
    await scraper.start()
    try:
        state["text"] = (
            PAGE.replace(
                'num_drafts_total{engine="0",model_name="tiny"} 90.0',
                'num_drafts_total{engine="0",model_name="tiny"} 100.0',
            )
            .replace(
                'num_accepted_tokens_total{engine="0",model_name="tiny"} 0.0',
                'num_accepted_tokens_total{engine="0",model_name="tiny"} 15.0',
            )
            .replace('position="0"} 0.0', 'position="0"} 10.0')
            .replace('position="1"} 0.0', 'position="1"} 5.0')
        )
        clock.now += 2.0
        await scraper.scrape_once()
        stats = scraper.pool_stats([url])
        assert stats is not None
        assert stats.span_s == 2.0
        assert stats.num_drafts == 10.0
        assert stats.mean_accept_length == pytest.approx(2.5)
        assert stats.accept_rate_per_position[:3] == pytest.approx([1.0, 0.5, 0.0])
        assert scraper.status(url).is_ok and scraper.status(url).last_success_s == 102.0
    finally:
        await scraper.close()


async def test_failures_are_recorded_and_never_raised(
    metrics_server: tuple[str, dict[str, str | int]],
) -> None:
    url, state = metrics_server
    dead = f"http://127.0.0.1:{_free_port()}"
    scraper = MetricsScraper([url, dead], interval_s=3600, timeout_s=2.0)
    await scraper.start()
    try:
        assert scraper.status(url).is_ok
        assert not scraper.status(dead).is_ok
        assert "ClientConnectorError" in str(scraper.status(dead).last_error)
        assert scraper.stats(dead) is None
        # The pool's statistics come from the server that answers.
        assert scraper.pool_stats([url, dead]) is not None

        state["status"] = 503
        await scraper.scrape_once()
        assert "HTTP 503" in str(scraper.status(url).last_error)
        assert scraper.pool_stats([url]) is None  # a failing server's stale window is left out

        state["status"], state["text"] = 200, 'vllm:num_requests_running{engine="0"} lots\n'
        await scraper.scrape_once()
        assert "is not a number" in str(scraper.status(url).last_error)
        assert scraper.status(url).num_failures == 2

        state["text"] = PAGE
        await scraper.scrape_once()
        assert scraper.status(url).is_ok and scraper.status(url).num_failures == 0
    finally:
        await scraper.close()


async def test_background_loop_keeps_scraping(
    metrics_server: tuple[str, dict[str, str | int]],
) -> None:
    url, _ = metrics_server
    clock = FakeClock()
    scraper = MetricsScraper([url], interval_s=0.05, timeout_s=2.0, clock=clock)
    await scraper.start()
    try:
        first = scraper.status(url).last_success_s
        clock.now += 1.0
        for _ in range(100):  # bounded: up to 5 s
            if scraper.status(url).last_success_s != first:
                break
            await asyncio.sleep(0.05)
        assert scraper.status(url).last_success_s == 101.0
    finally:
        await scraper.close()
