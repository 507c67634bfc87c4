"""Issue 15's reproducers through a real gateway: every one is a 400 OpenAI error naming the
input, nothing reaches the backend, and the in-flight count the policy sees stays right."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.controller.conftest import MODEL, StartGateway, StartUpstream, make_config, pool
from tests.policy_texts import STATIC_POLICY_TEXT

USER = {"role": "user", "content": "hi"}
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}


def _chat(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": [USER], "max_tokens": 4, **fields}).encode()


def _completion(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 4, **fields}).encode()


_MESSAGES = b'"messages": [{"role": "user", "content": '

# (endpoint path, body, the param the error names or None, a piece of its message)
REJECTED: list[tuple[str, bytes, str | None, str]] = [
    # 1. one field silently stopped the engine
    ("chat/completions", _chat(seed=1.5), "seed", "int64"),
    ("chat/completions", _chat(seed=True), "seed", "int64"),
    ("chat/completions", _chat(seed="abc"), "seed", "int64"),
    ("chat/completions", _chat(seed=[1]), "seed", "int64"),
    ("chat/completions", _chat(seed=2**64 + 5), "seed", "int64"),
    # 2. one client failed everyone in flight (the vocabulary is the engine's to check)
    ("completions", _completion(prompt=[-1, 1]), "prompt", "token ids"),
    ("completions", _completion(prompt="x", top_k=1180591620717411303424), "top_k", "top_k"),
    # 4. "stop": 5 answered 500 and leaked the in-flight count; "stop": [1] an empty 200
    ("chat/completions", _chat(stop=5), "stop", "at most 4 strings"),
    ("chat/completions", _chat(stop=[1]), "stop", "at most 4 strings"),
    # 5. parser 500s
    (
        "chat/completions",
        b'{"model": "demo", "x": ' + b"[" * 1100 + b"]" * 1100 + b"}",
        None,
        "nested",
    ),
    ("chat/completions", b'{"model": "demo", "x": ' + b"1" * 4301 + b"}", None, "4300 digits"),
    ("chat/completions", b'{"model": "demo", ' + _MESSAGES + b'"\xed\xa0\x80"}]}', None, "UTF-8"),
    ("chat/completions", b'{"model": "demo", ' + _MESSAGES + b'"\\ud800"}]}', None, "surrogate"),
    ("chat/completions", b'{"model": "demo", ' + _MESSAGES + b'"\xc3"}]}', None, "UTF-8"),
    # 8. max_tokens 0 generated 256 tokens; NaN/Infinity temperature were accepted
    ("chat/completions", _chat(max_tokens=0), "max_tokens", "from 1"),
    ("completions", _completion(prompt="x", max_tokens=0), "max_tokens", "from 1"),
    ("chat/completions", _chat(temperature=1).replace(b": 1}", b": NaN}"), "temperature", "NaN"),
    (
        "chat/completions",
        _chat(temperature=1).replace(b": 1}", b": Infinity}"),
        "temperature",
        "Infinity",
    ),
    # 3. shapes that are not OpenAI's still get a named 400
    (
        "chat/completions",
        json.dumps({"model": MODEL, "messages": [{"role": "user"}]}).encode(),
        "messages[0].content",
        "required",
    ),
    (
        "chat/completions",
        json.dumps({"model": MODEL, "messages": [{"role": "bot", "content": "x"}]}).encode(),
        "messages[0].role",
        "role",
    ),
]

# 3. every message shape the API defines answered 500 on the embedded engine; here they
# pass the gateway unchanged (the engine's own rendering is tested with the engine).
ACCEPTED: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
    [USER, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}],
    [
        USER,
        {"role": "assistant", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "content": "2", "tool_call_id": "c1"},
    ],
    [{"role": "developer", "content": "be brief"}, USER],
    [USER, {"role": "assistant"}, USER],
]


async def _post(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, Any]:
    headers = {"content-type": "application/json"}
    async with session.post(url, data=data, headers=headers) as response:
        return response.status, await response.json(content_type=None)


async def test_every_reproducer_is_a_named_400_and_reaches_no_backend(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    async with aiohttp.ClientSession() as session:
        for path, body, param, needle in REJECTED:
            status, answer = await _post(session, f"{gateway.url}/v1/{path}", body)
            case = f"{path} {body[:80]!r}"
            assert status == 400, (case, answer)
            assert set(answer["error"]) == {"message", "type", "param", "code"}, case
            assert answer["error"]["type"] == "invalid_request_error", case
            if param is not None:
                assert answer["error"]["param"] == param, (case, answer)
            assert needle in answer["error"]["message"], (case, answer)
    assert upstream.behaviour.received == []
    assert gateway.server.gateway is not None and gateway.server.gateway.num_inflight == 0


async def test_every_openai_message_shape_reaches_the_backend(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    async with aiohttp.ClientSession() as session:
        for messages in ACCEPTED:
            body = {"model": MODEL, "messages": messages}
            status, answer = await _post(
                session, gateway.url + "/v1/chat/completions", json.dumps(body).encode()
            )
            assert status == 200, (messages, answer)
            assert upstream.behaviour.received[-1] == body


async def test_rejected_requests_leave_the_policys_concurrency_alone(
    tmp_path: Path, start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    """After ten `"stop": 5` requests the policy still sees one request (this one), not 11."""
    upstream = await start_upstream()
    (tmp_path / "policy.yaml").write_text(STATIC_POLICY_TEXT)  # its reason names the load
    gateway = await start_gateway(make_config(tmp_path, [pool("k7", upstream.url, 7)]))
    async with aiohttp.ClientSession() as session:
        url = gateway.url + "/v1/chat/completions"
        for _ in range(10):
            assert (await _post(session, url, _chat(stop=5)))[0] == 400
        status, answer = await _post(session, url, _chat(stop="\n"))
    assert status == 200
    assert "concurrency=1 " in answer["draftctl"]["reason"]
    assert gateway.server.fleet.backends[0].num_inflight() == 0
