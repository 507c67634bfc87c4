"""`draftctl serve` as a real process: SIGTERM drains in-flight streams, then exits 0."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.controller.conftest import MODEL, StartUpstream, pool


async def _start_daemon(config: Path) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "controller.cli",
        "serve",
        "--config",
        str(config),
        "--port",
        "0",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        assert line, "daemon exited before listening"
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return proc, found.group(1)


@pytest.mark.parametrize(
    ("sig", "grace_s"),
    [(signal.SIGTERM, 0.0), (signal.SIGINT, 5.0)],  # SIGINT (Ctrl-C) skips the grace
)
async def test_signal_drains_in_flight_stream(
    tmp_path: Path, start_upstream: StartUpstream, sig: signal.Signals, grace_s: float
) -> None:
    upstream = await start_upstream(num_chunks=20, chunk_delay_s=0.05)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "server": {"drain_timeout_s": 10, "drain_grace_s": grace_s},
                "backends": [pool("k7", upstream.url, 7)],
            }
        )
    )
    proc, url = await _start_daemon(config)
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                first = await resp.content.readany()
                assert first.startswith(b"data: ")
                proc.send_signal(sig)
                await asyncio.sleep(0.3)
                with pytest.raises(aiohttp.ClientConnectionError):  # no longer accepting
                    async with aiohttp.ClientSession() as other:
                        await other.get(url + "/healthz")
                rest = first + await resp.content.read()
        events = [e for e in rest.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        contents = [json.loads(e[6:]) for e in events[:-1]]
        assert sum(len(c["choices"]) for c in contents) == 20
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _serve_until_exit(config: Path) -> tuple[int | None, str]:
    """Run `draftctl serve` expecting it to exit on its own; killed after 60 s if not."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "controller.cli",
        "serve",
        "--config",
        str(config),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode, err.decode()


async def test_startup_problems_exit_1_with_a_message(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    backend = {"name": "e", "kind": "embedded", "model": "m", "target": "nope/t", "draft": "d"}
    config.write_text(yaml.safe_dump({"server": {"port": 0}, "backends": [backend]}))
    returncode, err = await _serve_until_exit(config)
    assert returncode == 1
    assert f"target directory {tmp_path / 'nope/t'} not found" in err
    config = tmp_path / "fresh" / "config.yaml"  # no kept policy versions there yet
    config.parent.mkdir()
    (config.parent / "policy.yaml").write_text("kind: static\nbogus: 1\n")
    backends = [pool("p", "http://127.0.0.1:9", 0)]
    config.write_text(yaml.safe_dump({"server": {"port": 0}, "backends": backends}))
    returncode, err = await _serve_until_exit(config)
    assert returncode == 1 and "bogus: unknown key (line 2)" in err
