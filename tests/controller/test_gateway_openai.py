"""The official openai client, unmodified, against draftctl in front of fake pools."""

from __future__ import annotations

from pathlib import Path

import openai

from tests.controller.conftest import MODEL, StartGateway, StartUpstream, make_config, pool


async def _one_pool(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway, **behaviour: object
) -> tuple[str, object]:
    upstream = await start_upstream(**behaviour)
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    return gateway.url, upstream


async def test_chat_non_streaming(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    url, upstream = await _one_pool(tmp_path, start_upstream, start_gateway, num_chunks=4)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x")
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"draftctl": {"task": "math"}},
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "tok tok tok tok "
    assert raw.headers["x-draftctl-task"] == "math"
    assert raw.headers["x-draftctl-backend"] == "k7"
    assert raw.headers["x-draftctl-spec-tokens"] == "7"
    extra = completion.model_extra or {}
    assert extra["draftctl"]["task"] == "math" and extra["draftctl"]["spec_tokens"] == 7
    assert "draftctl" not in upstream.behaviour.received[0]  # stripped before forwarding


async def test_chat_streaming_without_usage(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    url, upstream = await _one_pool(tmp_path, start_upstream, start_gateway, num_chunks=6)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x")
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = [c async for c in stream]
    # The usage chunk the gateway asked for upstream is stripped: every chunk has a choice.
    assert all(c.choices for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "tok " * 6
    assert upstream.behaviour.received[0]["stream_options"] == {"include_usage": True}
    final = chunks[-1].model_extra or {}
    assert final["draftctl"]["backend"] == "k7"
    assert all("draftctl" not in (c.model_extra or {}) for c in chunks[:-1])


async def test_completions_streaming_with_usage(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    url, _ = await _one_pool(tmp_path, start_upstream, start_gateway, num_chunks=3)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x")
    stream = await client.completions.create(
        model=MODEL, prompt="1+1=", stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert (chunks[-1].model_extra or {})["draftctl"]["spec_tokens"] == 7
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "tok " * 3


async def test_models_lists_served_names(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    url, _ = await _one_pool(tmp_path, start_upstream, start_gateway)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x")
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
