"""Issue 15's reproducers against the real daemon with the embedded demo pair on CPU.

The gateway-level and engine-level versions live in tests/controller/test_request_*.py,
tests/controller/test_admin.py, tests/controller/policy/ and
tests/engines/embedded/test_isolation.py; here each one is sent as a user would send it, and
the requests beside it must not notice. Numbers refer to the issue's list.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from controller.policy.document import DEFAULT_POLICY_TEXT
from tests.policy_texts import STATIC_POLICY_TEXT
from tests.robustness.client import Sent, exchange, session
from tests.robustness.daemon import MODEL, Daemon
from tests.robustness.strategies import ALIAS_BOMB, large_body, nested
from tests.robustness.verdict import openai_error, stream_problem

pytestmark = pytest.mark.slow

JSON = {"content-type": "application/json"}
USER = {"role": "user", "content": "hi"}
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}


@pytest.fixture
async def http(daemon: Daemon) -> AsyncIterator[aiohttp.ClientSession]:
    async with session() as client:
        # A static policy whatever the fuzzer left running: the reasons below are its words.
        async with client.put(
            daemon.url + "/admin/policy", data=DEFAULT_POLICY_TEXT, headers=daemon.admin_headers()
        ) as response:
            assert response.status == 200, await response.text()
        yield client


def chat(**fields: Any) -> Sent:
    body = {"model": MODEL, "messages": [USER], "max_tokens": 4, **fields}
    return Sent("POST", "/v1/chat/completions", json.dumps(body).encode(), JSON)


def completion(**fields: Any) -> Sent:
    body = {"model": MODEL, "max_tokens": 4, **fields}
    return Sent("POST", "/v1/completions", json.dumps(body).encode(), JSON)


def stream(max_tokens: int = 24) -> Sent:
    return chat(max_tokens=max_tokens, temperature=0, stream=True)


async def status_and_error(
    http: aiohttp.ClientSession, daemon: Daemon, sent: Sent
) -> tuple[int | None, dict[str, Any] | None]:
    answer = await exchange(http, daemon.url, sent, 60)
    return answer.status, openai_error(answer.body)


async def assert_whole_stream(http: aiohttp.ClientSession, daemon: Daemon, sent: Sent) -> None:
    answer = await exchange(http, daemon.url, sent, 60)
    assert answer.status == 200 and stream_problem(answer.body) is None, answer


async def assert_rejected(
    http: aiohttp.ClientSession, daemon: Daemon, sent: Sent, param: str | None
) -> None:
    status, error = await status_and_error(http, daemon, sent)
    assert status == 400 and error is not None, (sent.describe(), status, error)
    if param is not None:
        assert error["param"] == param, (sent.describe(), error)


async def alongside(coro: Any, *others: Any) -> None:
    """Run ``others`` while ``coro`` (a stream) is running; both must succeed."""
    await asyncio.gather(coro, *others)


def assert_serving(daemon: Daemon) -> None:
    assert daemon.readyz() == 200
    assert daemon.metric("draftctl_backend_up") == 1.0
    assert daemon.wait_settled() == (0.0, 0)


BAD_SEEDS = [1.5, True, "abc", [1], 2**64 + 5]


async def test_1_a_bad_seed_is_a_400_and_the_engine_keeps_serving(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    async def bad_seeds() -> None:
        for seed in BAD_SEEDS:
            await assert_rejected(http, daemon, chat(seed=seed), "seed")

    await alongside(assert_whole_stream(http, daemon, stream(32)), bad_seeds())
    status, _ = await status_and_error(http, daemon, chat(seed=7, temperature=1))
    assert status == 200
    assert_serving(daemon)


async def test_2_a_prompt_outside_the_vocabulary_fails_alone(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    async def bad_prompts() -> None:
        for prompt in ([99999, 1], [6144, 1], [-1, 1]):
            await assert_rejected(http, daemon, completion(prompt=prompt), None)
        huge = 1180591620717411303424
        await assert_rejected(http, daemon, completion(prompt="x", top_k=huge), "top_k")

    await alongside(assert_whole_stream(http, daemon, stream(32)), bad_prompts())
    for top_k in (2**31 - 1, 6145, -1):  # valid, if larger than the vocabulary
        status, _ = await status_and_error(http, daemon, completion(prompt="x", top_k=top_k))
        assert status == 200, top_k
    assert_serving(daemon)


MESSAGE_SHAPES: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
    [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    [USER, {"role": "assistant", "content": None}, USER],
    [USER, {"role": "assistant"}, USER],
    [USER, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}],
    [
        USER,
        {"role": "assistant", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "content": "2", "tool_call_id": "c1"},
    ],
    [{"role": "developer", "content": "be brief"}, USER],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi", "name": "x"}],
    [USER, {"role": "function", "name": "f", "content": "{}"}],
    [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}, USER],
]


async def test_3_every_openai_message_shape_is_answered(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    for messages in MESSAGE_SHAPES:
        answer = await exchange(http, daemon.url, chat(messages=messages), 60)
        assert answer.status == 200, (messages, answer.body)
        content = json.loads(answer.body)["choices"][0]["message"]["content"]
        assert isinstance(content, str), messages
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    image_message = [{"role": "user", "content": [image]}]
    status, error = await status_and_error(http, daemon, chat(messages=image_message))
    assert status == 400 and error is not None
    assert error["param"] == "messages[0].content[0]" and "text-only" in error["message"]


async def test_4_a_bad_stop_is_a_400_and_leaks_no_in_flight_place(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    for _ in range(10):
        await assert_rejected(http, daemon, chat(stop=5), "stop")
    await assert_rejected(http, daemon, chat(stop=[1]), "stop")
    answer = await exchange(http, daemon.url, chat(stop=["\n"]), 60)
    assert answer.status == 200
    # The load the policy saw is this request alone: static says concurrency=1, goodput's
    # pool ranking the pool's in-flight count before this request (0).
    reason = json.loads(answer.body)["draftctl"]["reason"]
    assert re.search(r"\bconcurrency=1 |\binflight=0\b", reason), reason
    assert_serving(daemon)


PARSER_BODIES = [
    nested(1100),
    b'{"model": "demo", "x": ' + b"1" * 4301 + b"}",
    b'{"model": "demo", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
    b'{"model": "demo", "messages": [{"role": "user", "content": "\\ud800"}]}',
]


async def test_5_parser_limits_are_json_400s_everywhere(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    auth = {**JSON, **daemon.admin_headers()}
    for body in PARSER_BODIES:
        for path in ("/v1/chat/completions", "/v1/completions", "/admin/policy/rollback"):
            sent = Sent("POST", path, body, auth)
            status, error = await status_and_error(http, daemon, sent)
            assert status == 400 and error is not None, (path, body[:60], status)


async def test_7_an_alias_bomb_and_4mb_bodies_freeze_nobody(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """The bomb froze the daemon for 9.5 to > 90 s; a 4 MB body blocked everyone for ~4 s, and
    tokenizing it (~6 s here) left ~0.5 GB of RSS behind per worker thread that did it."""
    bomb = Sent("PUT", "/admin/policy", ALIAS_BOMB.encode(), daemon.admin_headers())
    bigs = [
        Sent("POST", "/v1/chat/completions", large_body("chat", 4_000_000), JSON),
        Sent("POST", "/v1/completions", large_body("completion", 4_000_000), JSON),
    ] * 2
    rss_before = daemon.rss_bytes()
    started = time.perf_counter()
    answers = await asyncio.gather(
        *(exchange(http, daemon.url, sent, 60) for sent in [bomb, chat(), *bigs])
    )
    assert [a.status for a in answers] == [422, 200, 400, 400, 400, 400]
    assert max(a.elapsed_s for a in answers) < 5, [a.elapsed_s for a in answers]
    for answer, param in zip(answers[2:], ["messages", "prompt"] * 2, strict=True):
        error = openai_error(answer.body)
        assert error is not None and error["param"] == param and "max_seq_len" in error["message"]
    assert time.perf_counter() - started < 5
    assert daemon.rss_bytes() < rss_before * 1.1
    assert_serving(daemon)


async def test_8_smaller_ones(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    await assert_rejected(http, daemon, chat(max_tokens=0), "max_tokens")
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        body = b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], '
        sent = Sent("POST", "/v1/chat/completions", body + b'"temperature": ' + literal + b"}")
        await assert_rejected(http, daemon, sent, "temperature")
    # An empty PUT is refused and leaves the file whole; an accepted one keeps its mode.
    os.chmod(daemon.policy_path, 0o640)
    for empty in (b"", b"  \n"):
        put = Sent("PUT", "/admin/policy", empty, daemon.admin_headers())
        assert (await exchange(http, daemon.url, put, 30)).status == 422
    assert daemon.policy_path.read_text().strip()
    edited = STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [7, 4, 4, 4]")
    put = Sent("PUT", "/admin/policy", edited.encode(), daemon.admin_headers())
    assert (await exchange(http, daemon.url, put, 30)).status == 200
    assert stat.S_IMODE(daemon.policy_path.stat().st_mode) == 0o640
    assert daemon.policy_path.read_text() == edited
