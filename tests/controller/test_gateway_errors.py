"""Bad input gets a 4xx OpenAI error naming the problem; backend failures never hang."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.controller.conftest import MODEL, StartGateway, StartUpstream, make_config, pool

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


async def _post(
    url: str, data: bytes | str, headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", data=data, headers=headers) as r:
            return r.status, await r.json()


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (json.dumps({**CHAT, "model": "nope"}).encode(), 404, "'nope' does not exist"),
        (json.dumps({**CHAT, "stream": "yes"}).encode(), 400, "'stream' must be a boolean"),
        (json.dumps({**CHAT, "max_tokens": "9"}).encode(), 400, "'max_tokens' must be an integer"),
        (json.dumps({"model": MODEL, "messages": []}).encode(), 400, "'messages' must be"),
        (json.dumps({**CHAT, "draftctl": {"task": "poetry"}}).encode(), 400, "draftctl.task"),
        (json.dumps({**CHAT, "draftctl": {"k": 3}}).encode(), 400, "unknown keys ['k']"),
        (json.dumps({**CHAT, "draftctl": "math"}).encode(), 400, "'draftctl' must be an object"),
        (b"", 400, "empty"),
    ],
)
async def test_bad_input_is_a_named_4xx(
    tmp_path: Path,
    start_upstream: StartUpstream,
    start_gateway: StartGateway,
    body: bytes,
    status: int,
    needle: str,
) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    got_status, got = await _post(gateway.url, body, {"content-type": "application/json"})
    assert got_status == status
    assert needle in got["error"]["message"]
    assert set(got["error"]) == {"message", "type", "param", "code"}
    assert upstream.behaviour.received == []


async def test_body_over_limit_and_bad_header_hint(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream()
    config = make_config(
        tmp_path, [pool("k7", upstream.url, 7)], server={"port": 0, "max_body_bytes": 2048}
    )
    gateway = await start_gateway(config)
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]})
    status, got = await _post(gateway.url, big)
    assert status == 413 and "server.max_body_bytes = 2048" in got["error"]["message"]
    status, got = await _post(gateway.url, json.dumps(CHAT), {"x-draftctl-task": "poems"})
    assert status == 400 and "x-draftctl-task" in got["error"]["message"]


async def test_retry_on_another_pool_before_first_byte(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    broken = await start_upstream(status=503)
    good = await start_upstream()
    # The policy wants k=15 for math at low load, so the broken k15 pool ranks first.
    pools = [pool("k15", broken.url, 15), pool("k7", good.url, 7)]
    gateway = await start_gateway(make_config(tmp_path, pools))
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(
        **CHAT, stream=True, extra_headers={"x-draftctl-task": "math"}
    )
    assert raw.headers["x-draftctl-backend"] == "k7"
    assert len(broken.behaviour.received) == 1 and len(good.behaviour.received) == 1
    chunks = [c async for c in raw.parse()]
    assert (chunks[-1].model_extra or {})["draftctl"]["backend"] == "k7"


async def test_refused_connection_retries_and_all_down_is_503(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    dead = await start_upstream()
    await dead.stop()  # nothing listens there any more
    gateway = await start_gateway(make_config(tmp_path, [pool("k15", dead.url, 15)]))
    status, got = await _post(gateway.url, json.dumps(CHAT))
    assert status == 503 and got["error"]["code"] == "backend_unavailable"
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url + "/readyz") as r:
            assert r.status == 503


async def test_mid_stream_death_ends_with_error_event_and_next_request_goes_elsewhere(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    dying = await start_upstream(num_chunks=50, die_after_chunks=3)
    good = await start_upstream()
    pools = [pool("k15", dying.url, 15), pool("k7", good.url, 7)]
    gateway = await start_gateway(make_config(tmp_path, pools))
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    stream = await client.chat.completions.create(
        **CHAT, stream=True, extra_headers={"x-draftctl-task": "math"}
    )
    received = []
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        async for chunk in stream:
            received.append(chunk)
    assert len(received) == 3
    # The dead server was taken out: the next request goes to the other pool.
    raw = await client.chat.completions.with_raw_response.create(
        **CHAT, extra_headers={"x-draftctl-task": "math"}
    )
    assert raw.headers["x-draftctl-backend"] == "k7"
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url + "/metrics") as r:
            text = await r.text()
    assert 'draftctl_backend_errors_total{backend="k15",stage="mid_stream"} 1.0' in text


async def test_client_disconnect_drops_the_upstream_request(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream(num_chunks=200, chunk_delay_s=0.02)
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            gateway.url + "/v1/chat/completions", json={**CHAT, "stream": True}
        )
        assert (await resp.content.readany()).startswith(b"data: ")
        resp.close()  # the client goes away mid-stream
    for _ in range(100):
        if upstream.behaviour.num_client_gone:
            break
        await asyncio.sleep(0.05)
    assert upstream.behaviour.num_client_gone == 1  # well before the 4 s stream would end
    assert gateway.server.fleet.backends[0].num_inflight() == 0


async def test_request_timeout_stops_stream_and_whole_response(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream(num_chunks=100, chunk_delay_s=0.05)
    config = make_config(
        tmp_path, [pool("k7", upstream.url, 7)], server={"port": 0, "request_timeout_s": 0.5}
    )
    gateway = await start_gateway(config)
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    stream = await client.chat.completions.create(**CHAT, stream=True)
    with pytest.raises(openai.APIError, match=r"request_timeout_s = 0\.5"):
        async for _ in stream:
            pass
    upstream.behaviour.whole_delay_s = 3.0
    status, got = await _post(gateway.url, json.dumps(CHAT))
    assert status == 504 and got["error"]["code"] == "timeout"


async def test_unexpected_bug_is_a_500_error_not_a_crash(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    planner = gateway.server.gateway.planner  # type: ignore[union-attr]
    original = planner.plan

    def broken(*args: object) -> None:
        raise KeyError("a bug")

    planner.plan = broken  # type: ignore[method-assign]
    status, got = await _post(gateway.url, json.dumps(CHAT))
    assert status == 500 and got["error"]["type"] == "server_error"
    planner.plan = original  # type: ignore[method-assign]
    status, _ = await _post(gateway.url, json.dumps(CHAT))
    assert status == 200
