"""Soak the real daemon (embedded demo pair, CPU): mixed streaming and whole requests, one in
five clients leaving early; 0 stuck, 0 lost, nothing in flight afterwards, still ready.

CI size by default; ``DRAFTCTL_SOAK_REQUESTS=20000`` for the full size (bench/robustness.py).
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from tests.robustness.client import session
from tests.robustness.daemon import Daemon
from tests.robustness.report import record, size
from tests.robustness.soak import soak

pytestmark = pytest.mark.slow

NUM_REQUESTS = size("DRAFTCTL_SOAK_REQUESTS")
CONCURRENCY = 24  # three times the engine's batch: requests queue as well as run


async def test_soak_with_disconnects_loses_nothing(daemon: Daemon) -> None:
    seed = int(os.environ.get("DRAFTCTL_SOAK_SEED") or random.randrange(2**32))
    served_before = daemon.metric("draftctl_requests_total")
    rss_before = daemon.rss_bytes()
    started = time.perf_counter()
    async with session() as http:
        tally = await soak(http, daemon.url, NUM_REQUESTS, CONCURRENCY, seed)
    duration_s = time.perf_counter() - started
    settled = await asyncio.to_thread(daemon.wait_settled)
    ready = await asyncio.to_thread(daemon.readyz)
    served = daemon.metric("draftctl_requests_total") - served_before
    completed = tally.statuses["200"]
    figures = {
        **tally.figures(),
        "seed": seed,
        "concurrency": CONCURRENCY,
        "completed": completed,
        "left_early": tally.statuses["left"],
        "stuck": tally.problems["stuck"],
        "lost": tally.problems["lost"],
        "served_by_backend": served,
        "duration_s": round(duration_s, 1),
        "requests_per_s": round(tally.num_requests / duration_s, 1),
        "readyz_after": ready,
        "inflight_after": {"gauge": settled[0], "gateway": settled[1]},
        "rss_before_bytes": rss_before,
        "rss_after_bytes": daemon.rss_bytes(),
    }
    record("soak", figures)
    assert not tally.problems, tally.report()
    assert tally.num_requests == NUM_REQUESTS
    assert served >= completed, (served, completed)  # every answered request was recorded
    assert ready == 200 and settled == (0.0, 0), (ready, settled)
