"""The embedded engine behind the gateway: OpenAI shapes, per-step k from the policy, stats.

Runs a real (tiny, random) Qwen3 target and DFlash draft on CPU, built by tests/tinymodels.py.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import openai
import pytest

from tests.controller.conftest import StartGateway, make_config

pytest.importorskip("torch")

from tests.tinymodels import write_tiny_pair

MODEL = "tiny"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_pair(
        tmp_path_factory.mktemp("tiny"), block_size=8, bias_token_id=65, bias_strength=4.0
    )


def backend_for(pair: tuple[Path, Path]) -> dict[str, object]:
    target, draft = pair
    return {
        "name": "emb",
        "kind": "embedded",
        "model": MODEL,
        "target": str(target),
        "draft": str(draft),
        "device": "cpu",
        "max_batch_size": 4,
        "max_seq_len": 256,
    }


async def test_embedded_engine_through_openai_client(
    tmp_path: Path, pair: tuple[Path, Path], start_gateway: StartGateway
) -> None:
    # Priced by the built-in relative cost, not a start-up profile timed on a CPU that other
    # work may be loading (a profile timed under load made drafting look like a loss, and the
    # math request below then never drafted: 1 run in 8-10 with both cores busy).
    backend = backend_for(pair) | {"cost_profile": False}
    gateway = await start_gateway(make_config(tmp_path, [backend]))
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x")
    messages = [{"role": "user", "content": "hello"}]

    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        temperature=0,
        extra_body={"draftctl": {"task": "math"}},
    )
    body = raw.parse()
    assert raw.headers["x-draftctl-backend"] == "emb"
    assert raw.headers["x-draftctl-spec-tokens"] == "7"  # math, low load: block 8 - 1
    assert body.usage is not None and body.usage.completion_tokens == 12
    info = (body.model_extra or {})["draftctl"]
    assert info["spec_tokens"] == 7 and info["num_drafts"] >= 1
    assert info["accept_length"] is not None and info["accept_length"] >= 1.0

    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        extra_body={"draftctl": {"task": "math"}},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == body.choices[0].message.content  # greedy: same text both ways
    assert (chunks[-1].model_extra or {})["draftctl"]["backend"] == "emb"

    completion = await client.completions.create(
        model=MODEL,
        prompt="abc",
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces = [c async for c in completion]
    assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 5

    with pytest.raises(openai.BadRequestError, match="'n' must be 1"):
        await client.completions.create(model=MODEL, prompt="abc", max_tokens=5, n=2)

    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url + "/api/stats") as r:
            stats = await r.json()
    assert stats["tasks"]["math"]["requests"] == 2
    assert stats["tasks"]["math"]["accept_length_mean"] >= 1.0
    emb = stats["backends"][0]
    assert emb["kind"] == "embedded" and emb["spec_tokens"] is None and emb["block_size"] == 8


async def test_tpot_of_whole_requests_comes_from_the_engine(
    tmp_path: Path, pair: tuple[Path, Path], start_gateway: StartGateway
) -> None:
    """Non-streamed requests give TPOT too: the engine times its own decode (the gateway can
    only time a stream's chunks)."""
    gateway = await start_gateway(make_config(tmp_path, [backend_for(pair)]))
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x")
    for task in ("math", "chat"):
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=12,
            temperature=0,
            extra_body={"draftctl": {"task": task}},
        )
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url + "/api/stats") as r:
            stats = await r.json()
    for task in ("math", "chat"):
        tpot = stats["tasks"][task]["tpot_p50_s"]
        assert tpot is not None and 0 < tpot < 5, stats["tasks"][task]
    assert stats["backends"][0]["tpot_p50_s"] is not None


async def test_the_engines_profile_reaches_a_goodput_policy_with_every_k_priced(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    """The backend tells its step controller the engine verifies rows at their own widths
    (the CPU engine packs them) before it offers the start-up profile, so the goodput policy
    prices k = 4 at 5 tokens a row, not padded to k = 7's width."""
    from engines.config import EmbeddedConfig
    from engines.embedded_backend import EmbeddedEngineBackend
    from engines.step_controller import FixedPolicySource
    from policies.goodput import GoodputPolicy
    from policies.model import GoodputSpec, PolicySpec
    from policies.online import OnlineModels

    spec = PolicySpec(kind="goodput")
    models = OnlineModels(spec.goodput, 8)
    source = FixedPolicySource(spec, GoodputPolicy(GoodputSpec()), models)
    config = EmbeddedConfig.model_validate(backend_for(pair) | {"cost_cache_dir": tmp_path})
    backend = EmbeddedEngineBackend(config, source)
    await backend.start()
    try:
        assert backend.steps.ragged
        assert models.cost is not None and models.cost.verify_width_multiple == 1
        snapshot = models.cost.snapshot()
        assert snapshot.step_time_s(1, 4) != snapshot.step_time_s(1, 7)
    finally:
        await backend.close()
