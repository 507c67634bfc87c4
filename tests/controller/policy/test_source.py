"""The daemon's policy source over real HTTP: ``draftctl``'s Server on loopback, fake pools.

Issue #15 reproducer, end to end: a goodput policy whose ``cost_table`` cannot be read used to
answer 200, be listed as active while the old policy kept running, and stop the next start.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp

from tests.controller.conftest import StartGateway, StartUpstream, make_config, pool

ROOT = Path(__file__).resolve().parents[3]
GOODPUT = "kind: goodput\ngoodput:\n  cost_table: {table}\n"


async def _metric(session: aiohttp.ClientSession, url: str, name: str) -> str:
    async with session.get(url + "/metrics") as response:
        lines = (await response.text()).splitlines()
    return next(line for line in lines if line.startswith(name + " "))


async def test_unbuildable_put_is_422_and_the_daemon_restarts_on_the_old_policy(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream()
    config = make_config(tmp_path, [pool("k7", upstream.url, 7)])
    gateway = await start_gateway(config)
    running = gateway.server.policy.current()
    async with aiohttp.ClientSession() as session:
        admin = gateway.url + "/admin/policy"
        async with session.put(admin, data=GOODPUT.format(table="missing.json")) as r:
            assert r.status == 422
            body = await r.json()
        assert body["error"]["code"] == "invalid_policy"
        assert body["errors"][0]["path"] == "goodput.cost_table"
        async with session.get(admin + "/versions") as r:
            assert [v["version"] for v in (await r.json())["versions"]] == [1]
        assert await _metric(session, gateway.url, "draftctl_policy_version") == (
            "draftctl_policy_version 1.0"
        )
    assert gateway.server.policy.current() is running
    await gateway.stop()
    again = await start_gateway(config)  # the daemon still starts
    assert again.server.policy.current().version == 1


async def test_accepted_put_runs_the_object_the_store_built(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    shutil.copy(ROOT / "cost_tables" / "qwen3-8b-h200.json", tmp_path / "cost.json")
    upstream = await start_upstream()
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    async with aiohttp.ClientSession() as session:
        url = gateway.url + "/admin/policy"
        async with session.put(url, data=GOODPUT.format(table="cost.json")) as r:
            assert r.status == 200 and (await r.json())["version"] == 2
        assert await _metric(session, gateway.url, "draftctl_policy_version") == (
            "draftctl_policy_version 2.0"
        )
    running = gateway.server.policy.current()
    assert running.version == 2 and running.models is not None
    assert running is gateway.server.policy.store.running()
