"""Routing follows the policy and live load; acceptance reaches the client, /metrics, /api/stats."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import openai
import pytest

from policies.types import Task
from tests.controller.conftest import MODEL, StartGateway, StartUpstream, make_config, pool
from tests.controller.fake_upstream import vllm_spec_metrics

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
# Chat: k=7 alone, drafting off from 2 requests in flight.
POLICY = """kind: static
static:
  concurrency_bands: [1]
  spec_tokens: {math: [max, max], code: [max, max], chat: [7, 0]}
"""


async def test_chat_under_load_goes_to_the_no_spec_pool(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    spec = await start_upstream(num_chunks=30, chunk_delay_s=0.05)
    plain = await start_upstream()
    config = make_config(tmp_path, [pool("k7", spec.url, 7), pool("k0", plain.url, 0)])
    gateway = await start_gateway(config)
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x")
    alone = await client.chat.completions.with_raw_response.create(**CHAT, stream=True)
    assert alone.headers["x-draftctl-backend"] == "k7"  # concurrency 1 -> k=7
    stream = alone.parse()
    await stream.__anext__()  # keep it in flight
    loaded = await client.chat.completions.with_raw_response.create(**CHAT)
    assert loaded.headers["x-draftctl-spec-tokens"] == "0"
    assert loaded.headers["x-draftctl-backend"] == "k0"
    reason = (loaded.parse().model_extra or {})["draftctl"]["reason"]
    assert "concurrency=2" in reason and "k=0" in reason
    async for _ in stream:
        pass


async def test_acceptance_reaches_client_metrics_and_stats(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream(num_chunks=8, spec=vllm_spec_metrics(7))
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x")
    whole = await client.chat.completions.create(**CHAT, extra_body={"draftctl": {"task": "code"}})
    info = (whole.model_extra or {})["draftctl"]
    assert info["accept_length"] == 3.5 and info["num_drafts"] == 4
    stream = await client.chat.completions.create(
        **CHAT, stream=True, extra_headers={"x-draftctl-task": "code"}
    )
    final = [c async for c in stream][-1]
    assert (final.model_extra or {})["draftctl"]["accept_length"] == 3.5
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url + "/metrics") as r:
            metrics = await r.text()
        async with session.get(gateway.url + "/api/stats") as r:
            stats = await r.json()
    assert 'draftctl_accept_length{backend="k7",task="code"} 3.5' in metrics
    assert 'draftctl_requests_total{backend="k7",task="code"} 2.0' in metrics
    assert 'draftctl_spec_tokens_chosen_total{spec_tokens="7",task="code"} 2.0' in metrics
    assert 'draftctl_backend_up{backend="k7"} 1.0' in metrics
    assert "draftctl_policy_version 1.0" in metrics
    code = stats["tasks"]["code"]
    assert code["requests"] == 2 and code["accept_length_mean"] == 3.5
    assert code["spec_tokens_chosen"] == {"7": 2}
    assert code["tpot_p50_s"] is not None
    backend = stats["backends"][0]
    assert backend["name"] == "k7" and backend["healthy"] and backend["spec_tokens"] == 7
    # 8 drafts over two requests; vLLM's histogram [0,1,1,1,1,0,0,0] accepts position 1 4/4.
    assert backend["accept_rate_per_position"][:5] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert stats["policy"] == {"version": 1, "kind": "goodput"}  # the default


async def test_failing_policy_degrades_to_k0_and_is_counted(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(
        make_config(tmp_path, [pool("k7", upstream.url, 7), pool("k0", upstream.url, 0)])
    )

    class Broken:
        name = "broken"

        def decide(self, observation: object) -> object:
            raise RuntimeError("boom")

    running = gateway.server.policy.current()
    gateway.server.policy._running = type(running)(running.version, running.spec, Broken())
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x")
    raw = await client.chat.completions.with_raw_response.create(**CHAT)
    assert raw.headers["x-draftctl-backend"] == "k0"
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url + "/metrics") as r:
            assert 'draftctl_degraded_decisions_total{component="policy"} 1.0' in await r.text()
    await asyncio.sleep(0)


async def test_admin_put_swaps_the_running_policy(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(
        make_config(tmp_path, [pool("k7", upstream.url, 7), pool("k0", upstream.url, 0)])
    )
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x")
    before = await client.chat.completions.with_raw_response.create(**CHAT)
    assert before.headers["x-draftctl-backend"] == "k7"
    off = POLICY.replace("chat: [7, 0]", "chat: [0, 0]")
    async with aiohttp.ClientSession() as session:
        async with session.put(gateway.url + "/admin/policy", data=off) as r:
            assert r.status == 200, await r.text()
        bad = off.replace("kind: static", "kind: static\nbogus: 1")
        async with session.put(gateway.url + "/admin/policy", data=bad) as r:
            assert r.status == 422
    after = await client.chat.completions.with_raw_response.create(**CHAT)
    assert after.headers["x-draftctl-backend"] == "k0"
    assert gateway.server.policy.current().version == 2


async def test_goodput_policy_learns_from_finished_requests(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    (tmp_path / "policy.yaml").write_text("kind: goodput\n")
    upstream = await start_upstream(num_chunks=8, spec=vllm_spec_metrics(7))
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    running = gateway.server.policy.current()
    assert running.spec.kind == "goodput" and running.models is not None
    before = running.models.observe(Task.MATH)["accept_trials"]
    chat_before = running.models.observe(Task.CHAT)["accept_trials"]
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x")
    for _ in range(3):
        raw = await client.chat.completions.with_raw_response.create(
            **CHAT, extra_headers={"x-draftctl-task": "math"}
        )
        assert raw.headers["x-draftctl-backend"] == "k7"
        assert (raw.parse().model_extra or {})["draftctl"]["reason"]
    after = running.models.observe(Task.MATH)["accept_trials"]
    # Each request reported 4 verify steps of k = 7: position 1 was tried 12 more times.
    assert after[0] == pytest.approx(before[0] + 12, rel=0.05)
    assert running.models.observe(Task.CHAT)["accept_trials"] == chat_before  # math only
