"""What reaches the upstream: the client's request, with only draftctl's own fields changed."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from tests.controller.conftest import MODEL, StartGateway, StartUpstream, make_config, pool

MESSAGES = [{"role": "user", "content": "Erkläre mir bitte 😀 diese Funktion"}]


async def _post(url: str, data: bytes) -> tuple[int, bytes]:
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", data=data, headers=headers) as r:
            return r.status, await r.read()


async def test_the_upstream_gets_the_clients_body_plus_the_usage_switch(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream(num_chunks=3)
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    body = {"model": MODEL, "messages": MESSAGES, "stream": True, "seed": 7, "top_p": 0.5}
    status, _ = await _post(gateway.url, json.dumps(body, ensure_ascii=False).encode())
    assert status == 200
    assert upstream.behaviour.received == [{**body, "stream_options": {"include_usage": True}}]


async def test_json_the_stdlib_accepts_is_still_served(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    """A UTF-8 BOM and UTF-16 are not strict JSON-over-HTTP, but they parsed before."""
    upstream = await start_upstream(num_chunks=3)
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    body = {"model": MODEL, "messages": MESSAGES, "stream": False}
    text = json.dumps(body, ensure_ascii=False)
    for data in (b"\xef\xbb\xbf" + text.encode(), text.encode("utf-16")):
        status, answer = await _post(gateway.url, data)
        assert status == 200, answer
        assert upstream.behaviour.received[-1] == body
        assert json.loads(answer)["draftctl"]["backend"] == "k7"
