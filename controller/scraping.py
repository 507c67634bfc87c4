"""Feeds what each pool's ``/metrics`` says (engines/scraper.py) into the live stats."""

from __future__ import annotations

from controller.config import Config
from controller.stats import LiveStats, ScrapedView
from engines.config import PoolConfig
from engines.scraper import MetricsScraper


class Scraping:
    def __init__(self, config: Config, stats: LiveStats) -> None:
        self.pools = [b for b in config.backends if isinstance(b, PoolConfig)]
        self.stats = stats
        urls = [url for pool in self.pools for url in pool.urls]
        self.scraper = (
            MetricsScraper(
                urls, interval_s=config.stats.scrape_interval_s, window_s=config.stats.window_s
            )
            if urls
            else None
        )

    async def start(self) -> None:
        if self.scraper is not None:
            await self.scraper.start()

    async def close(self) -> None:
        if self.scraper is not None:
            await self.scraper.close()

    def publish(self) -> None:
        """Copy each pool's latest window into LiveStats (the main loop calls this ~1/s)."""
        if self.scraper is None:
            return
        for pool in self.pools:
            window = self.scraper.pool_stats(pool.urls)
            if window is None:
                self.stats.scraped.pop(pool.name, None)
                continue
            self.stats.scraped[pool.name] = ScrapedView(
                running=None if window.running is None else round(window.running),
                waiting=None if window.waiting is None else round(window.waiting),
                accept_length_mean=window.mean_accept_length,
                accept_rate_per_position=window.accept_rate_per_position,
            )
