"""Small helpers for talking to the gateway in the integration suite (bounded waits)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import openai

from tests.integration.stack import MODEL, Gateway

T = TypeVar("T")
QUESTION = [{"role": "user", "content": "What is 12 * 7?"}]


def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", timeout=120, max_retries=0)


def chat_args(task: str, *, max_tokens: int = 16, temperature: float = 0.0) -> dict[str, Any]:
    """Keyword arguments for ``chat.completions.create`` with a task hint."""
    return {
        "model": MODEL,
        "messages": QUESTION,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "extra_headers": {"x-draftctl-task": task},
        "extra_body": {"ignore_eos": True},
    }


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
        return text


def backend_stats(gateway: Gateway, name: str) -> dict[str, Any]:
    backends = get_json(f"{gateway.url}/api/stats")["backends"]
    matching = [b for b in backends if b["name"] == name]
    assert matching, f"backend {name} missing from /api/stats: {backends}"
    found: dict[str, Any] = matching[0]
    return found


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text whose labels include ``labels``."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(read: Callable[[], T], is_done: Callable[[T], bool], timeout_s: float, what: str) -> T:
    """Poll ``read`` until ``is_done``; fail with the last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if is_done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout_s} s; last value {value!r}")
        time.sleep(0.25)
