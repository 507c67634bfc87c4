"""Property-based fuzzing of a real daemon: ``/v1/chat/completions``, ``/v1/completions`` and
the admin API, with the embedded demo pair on CPU (issue 15's targets).

Hypothesis draws each request (tests/robustness/strategies.py); about one in ten runs beside
a well-formed companion request, and a canary stream runs throughout. Per request: no status
>= 500, no hang, no empty 200, every 4xx in the OpenAI error shape; every companion and canary
request is a whole 200. At the end: ``/readyz`` 200, nothing in flight, RSS within 10% of its
value after a warm-up (every kind of request, then a short soak).

CI size by default; ``DRAFTCTL_FUZZ_REQUESTS=10000`` for the full size (bench/robustness.py).
Shrinking is off: a failing request is reported as sent, and the run's figures stay whole.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.dashboard.daemon import LoopThread
from tests.robustness.canary import COMPANION, TIMEOUT_S, Canary, check
from tests.robustness.client import Sent, exchange, session
from tests.robustness.daemon import TOKEN, Daemon
from tests.robustness.report import record, size
from tests.robustness.soak import soak
from tests.robustness.strategies import (
    ALIAS_BOMB,
    RAW_BODIES,
    Case,
    cases,
    large_body,
)
from tests.robustness.verdict import Tally, problem

pytestmark = pytest.mark.slow

NUM_REQUESTS = size("DRAFTCTL_FUZZ_REQUESTS")
MAX_RSS_GROWTH = 0.10
WARM_UP_SOAK = 100  # requests of the warm-up's short soak
JSON = {"content-type": "application/json"}


def warm_up_requests(tables: dict[str, Path]) -> list[Sent]:
    """One of each kind of request, so that the RSS baseline has seen them all."""
    auth = {"authorization": f"Bearer {TOKEN}"}
    chat = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}
    goodput = f"kind: goodput\ngoodput:\n  cost_table: {tables['valid']}\n".encode()
    large = (
        (4_000_000, "chat", "/v1/chat/completions"),
        (300_000, "completion", "/v1/completions"),
    )
    return [
        Sent("POST", "/v1/chat/completions", json.dumps(chat).encode(), JSON),
        Sent("POST", "/v1/chat/completions", json.dumps({**chat, "stream": True}).encode(), JSON),
        Sent("POST", "/v1/completions", b'{"model":"demo","prompt":[1,2,3],"max_tokens":12}', JSON),
        *(Sent("POST", "/v1/chat/completions", body, JSON) for body in RAW_BODIES),
        *(Sent("POST", path, large_body(kind, n), JSON) for n, kind, path in large),
        Sent("PUT", "/admin/policy", ALIAS_BOMB.encode(), auth),
        Sent("PUT", "/admin/policy", goodput, auth),
        Sent("POST", "/admin/policy/validate", b"kind: static\n", auth),
        Sent("POST", "/admin/policy/rollback", b'{"version": 1}', auth),
        Sent("GET", "/admin/policy/versions", None, auth),
    ]


async def send_case(
    http: aiohttp.ClientSession, base: str, case: Case, tally: Tally, companions: Tally
) -> None:
    async def fuzzed() -> None:
        answer = await exchange(http, base, case.sent, TIMEOUT_S)
        tally.add(case.sent, answer, problem(answer, case.sent.path.startswith("/v1/")))

    if case.with_companion:
        await asyncio.gather(fuzzed(), check(http, base, COMPANION, companions))
    else:
        await fuzzed()


def test_fuzzed_requests_never_hurt_the_daemon(
    daemon: Daemon, loops: LoopThread, cost_tables: dict[str, Path]
) -> None:
    http = loops.run(_open())
    try:
        warm = _warm_up(loops, http, daemon, cost_tables)
        rss_warm = daemon.rss_bytes()
        tally, companions = Tally(), Tally()
        fuzz_seed = int(os.environ.get("DRAFTCTL_FUZZ_SEED") or random.randrange(2**32))
        rss_samples: list[int] = []  # after every tenth of the requests

        def sample(num_sent: int) -> None:
            if num_sent % max(1, NUM_REQUESTS // 10) == 0:
                rss_samples.append(daemon.rss_bytes())

        canary = Canary(loops, http, daemon.url)
        try:
            _fuzz(loops, http, daemon.url, cost_tables, fuzz_seed, tally, companions, sample)
        finally:
            canary_tally = canary.stop()
        settled = daemon.wait_settled()
        ready = daemon.readyz()
        rss_end = daemon.rss_bytes()
    finally:
        loops.run(http.close())
    figures = {
        **tally.figures(),
        "seed": fuzz_seed,
        "companions": companions.figures(),
        "canary": canary_tally.figures(),
        "warm_up": warm.figures(),
        "readyz_after": ready,
        "inflight_after": {"gauge": settled[0], "gateway": settled[1]},
        "rss_after_warm_up_bytes": rss_warm,
        "rss_every_tenth_bytes": rss_samples,
        "rss_after_bytes": rss_end,
        "rss_growth": round(rss_end / rss_warm - 1, 4),
    }
    record("fuzz", figures)
    for name, counted in (("fuzzed", tally), ("companion", companions), ("canary", canary_tally)):
        assert not counted.problems, f"{name} requests:\n{counted.report()}"
    assert not warm.problems, warm.report()
    assert tally.num_requests >= NUM_REQUESTS * 0.95, tally.num_requests
    assert canary_tally.num_requests > 0 and companions.num_requests > 0
    assert ready == 200 and settled == (0.0, 0), (ready, settled)
    assert rss_end <= rss_warm * (1 + MAX_RSS_GROWTH), (rss_warm, rss_end)


def _warm_up(
    loops: LoopThread, http: aiohttp.ClientSession, daemon: Daemon, tables: dict[str, Path]
) -> Tally:
    """Every kind of request twice, then a short soak (concurrent mixed requests, clients
    leaving): the RSS baseline is taken once the daemon has seen all of it."""
    warm = Tally()
    for _ in range(2):
        for sent in warm_up_requests(tables):
            answer = loops.run(exchange(http, daemon.url, sent, TIMEOUT_S), TIMEOUT_S + 10)
            warm.add(sent, answer, problem(answer, sent.path.startswith("/v1/")))
    burst = loops.run(soak(http, daemon.url, WARM_UP_SOAK, 24, seed=0), 600)
    assert not burst.problems, burst.report()
    daemon.wait_settled()
    return warm


def _fuzz(
    loops: LoopThread,
    http: aiohttp.ClientSession,
    base: str,
    tables: dict[str, Path],
    fuzz_seed: int,
    tally: Tally,
    companions: Tally,
    on_sent: Callable[[int], None],
) -> None:
    @seed(fuzz_seed)
    @settings(
        max_examples=NUM_REQUESTS,
        deadline=None,
        database=None,  # nothing written under the repository
        phases=[Phase.generate],  # every drawn request counts once; no shrinking re-runs
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases(TOKEN, tables))
    def one(case: Case) -> None:
        loops.run(send_case(http, base, case, tally, companions), 2 * TIMEOUT_S + 10)
        on_sent(tally.num_requests)

    one()


async def _open() -> aiohttp.ClientSession:
    return session()
