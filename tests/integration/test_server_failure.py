"""Killing the k7 vLLM server mid-stream: the client's stream ends with an error event (no hang)
and new requests go to the pool that is left. Kills a session server, so this module runs last."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.integration.gateway_client import backend_stats, chat_args, client, get_text, wait_for
from tests.integration.stack import MODEL, Fleet, Gateway

pytestmark = pytest.mark.vllm

STREAM_END_TIMEOUT_S = 30.0


def test_killing_a_server_mid_stream_ends_the_stream_and_reroutes(
    gateway: Gateway, fleet: Fleet
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 400,
        "temperature": 1.0,  # accepts almost nothing: ~1 token per step, a long stream
        "ignore_eos": True,
        "stream": True,
    }
    events: list[str] = []
    killed_at = None
    request = urllib.request.Request(
        f"{gateway.url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-draftctl-task": "code"},
    )
    # The socket timeout bounds every read: a hung stream fails the test instead of hanging it.
    with urllib.request.urlopen(request, timeout=STREAM_END_TIMEOUT_S) as response:
        assert response.headers["x-draftctl-backend"] == "vllm-k7"
        for raw_line in response:
            line = raw_line.decode().strip()
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
            if len(events) == 3 and killed_at is None:
                fleet.k7.kill()  # SIGKILL the server's whole process group
                killed_at = time.monotonic()
    assert killed_at is not None, f"the stream ended before the kill: {events}"
    assert time.monotonic() - killed_at < STREAM_END_TIMEOUT_S
    errors = [json.loads(e) for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert errors, f"no error event after the kill; last events: {events[-3:]}"
    assert errors[-1]["error"]["message"]

    # New requests go to the pool that is left (math would prefer k7).
    raw = client(gateway).chat.completions.with_raw_response.create(
        **chat_args("math", max_tokens=4)
    )
    assert raw.headers["x-draftctl-backend"] == "vllm-nospec"
    assert raw.parse().choices[0].message.content is not None

    wait_for(
        lambda: backend_stats(gateway, "vllm-k7")["healthy"],
        lambda healthy: healthy is False,
        timeout_s=15,
        what="vllm-k7 marked unhealthy",
    )
    metrics = get_text(f"{gateway.url}/metrics")
    assert 'draftctl_backend_up{backend="vllm-k7"} 0.0' in metrics
    assert 'draftctl_backend_up{backend="vllm-nospec"} 1.0' in metrics
