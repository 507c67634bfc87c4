"""Helpers for browser tests against a real ``draftctl serve`` subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Coroutine
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

T = TypeVar("T")
MODEL = "demo"


class LoopThread:
    """An asyncio loop in a thread, for the fake pools and the traffic (Playwright's sync
    API owns the test thread's loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def start_daemon(config_path: Path) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "controller.cli", "serve", "--config", str(config_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    deadline = time.monotonic() + 90  # the embedded engine loads its models first
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining
            return proc, found.group(1)
    proc.kill()
    raise AssertionError("draftctl serve did not start:\n" + "".join(lines))


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def wait_ready(base: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if get_json(f"{base}/readyz")["ready"]:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{base}/readyz never said ready")


async def traffic(
    base: str, task: str, num_requests: int, concurrency: int, **fields: Any
) -> list[str]:
    """Streamed chat completions hinted as ``task``; returns the backends that served them."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"a {task} question"}],
        "stream": True,
        "max_tokens": 32,
        **fields,
    }
    gate = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession) -> str:
        async with (
            gate,
            session.post(
                f"{base}/v1/chat/completions", json=body, headers={"x-draftctl-task": task}
            ) as response,
        ):
            assert response.status == 200, await response.text()
            text = (await response.read()).decode()
            assert '"error"' not in text, text
            return response.headers["x-draftctl-backend"]

    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(one(session) for _ in range(num_requests))))


def js_fixed(value: float, digits: int = 2) -> str:
    """``value.toFixed(digits)`` as the dashboard's JavaScript writes it: the float's exact
    value, a tie rounded up (2.125 -> "2.13", where Python's format gives "2.12": a CI run of
    session 43 met that tie)."""
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))
