"""The fake vLLM-shaped upstream (tests/controller/fake_upstream.py) as a process of its own,
on a fixed loopback port, so that a test can SIGKILL a pool server and start it again.

    python tests/robustness/upstream.py PORT NUM_CHUNKS CHUNK_DELAY_S
"""

from __future__ import annotations

import sys
from pathlib import Path

from aiohttp import web

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.controller.fake_upstream import Behaviour, FakeUpstream  # noqa: E402
from tests.integration.processes import Process, start, wait_ready  # noqa: E402


def start_upstream(
    directory: Path, name: str, port: int, num_chunks: int, chunk_delay_s: float
) -> Process:
    """Start this file as a process serving on ``port``; wait until ``/health`` answers."""
    argv = [sys.executable, __file__, str(port), str(num_chunks), str(chunk_delay_s)]
    process = start(name, argv, directory, {})
    wait_ready([(process, f"http://127.0.0.1:{port}/health")], 30)
    return process


def main(argv: list[str]) -> None:
    port, num_chunks, chunk_delay_s = int(argv[0]), int(argv[1]), float(argv[2])
    upstream = FakeUpstream(Behaviour(num_chunks=num_chunks, chunk_delay_s=chunk_delay_s))
    web.run_app(upstream.app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
