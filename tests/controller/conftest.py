"""Fixtures: fake upstream pools on loopback and a real draftctl Server in front of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from controller.config import Config
from controller.server import Server
from tests.controller.fake_upstream import Behaviour, FakeUpstream

MODEL = "demo"


def pool(name: str, url: str, k: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "vllm",
        "urls": [url],
        "model": MODEL,
        "spec_tokens": k,
        "block_size": 16,
        "health_interval_s": 0.2,
        "timeout_s": 5,
        **extra,
    }


def make_config(tmp_path: Path, backends: list[dict[str, Any]], **sections: Any) -> Config:
    data = {"server": {"port": 0, "drain_timeout_s": 5}, "backends": backends, **sections}
    return Config.model_validate(data, context={"base_dir": tmp_path})


class Running:
    def __init__(self, server: Server, task: asyncio.Task[None]) -> None:
        self.server = server
        self.task = task
        self.url = f"http://127.0.0.1:{server.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.wait_for(self.task, 15)


StartGateway = Callable[[Config], Awaitable[Running]]
StartUpstream = Callable[..., Awaitable[FakeUpstream]]


@pytest.fixture
async def start_upstream() -> AsyncIterator[StartUpstream]:
    started: list[FakeUpstream] = []

    async def start(**behaviour: Any) -> FakeUpstream:
        upstream = FakeUpstream(Behaviour(**behaviour))
        await upstream.start()
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        await upstream.stop()


@pytest.fixture
async def start_gateway() -> AsyncIterator[StartGateway]:
    running: list[Running] = []

    async def start(config: Config) -> Running:
        server = Server(config, host="127.0.0.1", port=0)
        task = asyncio.create_task(server.serve(install_signals=False))
        started = asyncio.create_task(server.started.wait())
        done, _ = await asyncio.wait({task, started}, timeout=10, return_when="FIRST_COMPLETED")
        if task in done:
            task.result()
        assert started in done, "gateway did not start in 10 s"
        handle = Running(server, task)
        running.append(handle)
        return handle

    yield start
    for handle in running:
        if not handle.task.done():
            await handle.stop()
