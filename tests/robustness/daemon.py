"""A real ``draftctl serve`` process for the robustness suite, and what it is asked about.

The daemon runs as a user runs it (``python -m controller.cli serve --config``) in its own
process group on a loopback port, with the embedded demo pair on CPU or with pools. Every wait
is bounded. Its health is read the way an operator reads it: ``/readyz``, the in-flight gauge
in ``/metrics``, the gateway's admitted-request count in ``/api/stats`` and the process RSS.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.processes import Process, free_port, start, wait_ready

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "models" / "demo"
MODEL = "demo"
TOKEN = "robustness-admin-token"
TOKEN_ENV = "DRAFTCTL_ADMIN_TOKEN"
START_TIMEOUT_S = 120.0  # the embedded engine loads the demo pair first (~4 s when idle)
# Prompt + output tokens per request. Small, so that a fuzzed request that asks for every
# token it may have (no max_tokens: 256) is refused instead of decoding for seconds.
MAX_SEQ_LEN = 160


def embedded_backend(max_seq_len: int = MAX_SEQ_LEN) -> dict[str, Any]:
    return {
        "name": "embedded",
        "kind": "embedded",
        "model": MODEL,
        "target": str(DEMO / "target"),
        "draft": str(DEMO / "draft"),
        "device": "cpu",
        "max_batch_size": 8,
        "max_seq_len": max_seq_len,
    }


def pool_backend(name: str, url: str, k: int) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "vllm",
        "urls": [url],
        "model": MODEL,
        "spec_tokens": k,
        "block_size": 8,
        "health_interval_s": 0.2,
        "timeout_s": 10,
        "connect_timeout_s": 1,
    }


@dataclass
class Daemon:
    url: str
    process: Process
    directory: Path
    token: str | None

    @property
    def pid(self) -> int:
        return self.process.popen.pid

    @property
    def policy_path(self) -> Path:
        return self.directory / "policy.yaml"

    def admin_headers(self) -> dict[str, str]:
        return {} if self.token is None else {"authorization": f"Bearer {self.token}"}

    def rss_bytes(self) -> int:
        """Resident set size of the daemon process (``VmRSS`` in /proc)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmRSS for pid {self.pid}")

    def get(self, path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, headers=self.admin_headers())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def readyz(self) -> int:
        return self.get("/readyz")[0]

    def inflight(self) -> tuple[float, int]:
        """(``draftctl_inflight_requests`` summed over backends, the gateway's admitted
        requests as ``/api/stats`` last sampled them, once a second)."""
        text = self.get("/metrics")[1].decode()
        gauge = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("draftctl_inflight_requests{")
        )
        current = json.loads(self.get("/api/stats")[1])["concurrency"]["current"]
        return gauge, int(current)

    def metric(self, name: str) -> float:
        """The sum of every sample of the counter or gauge ``name``."""
        text = self.get("/metrics")[1].decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")
        )

    def wait_settled(self, timeout_s: float = 15.0) -> tuple[float, int]:
        """Wait until nothing is in flight (the gateway's count is sampled once a second)."""
        deadline = time.monotonic() + timeout_s
        while True:
            values = self.inflight()
            if values == (0.0, 0):
                time.sleep(1.2)  # one more sample: a request may have been admitted since
                values = self.inflight()
                if values == (0.0, 0):
                    return values
            if time.monotonic() > deadline:
                return values
            time.sleep(0.2)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        self.process.stop(timeout_s)
        return self.process.popen.returncode


def write_config(directory: Path, backends: list[dict[str, Any]], port: int, **server: Any) -> Path:
    config = {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "drain_timeout_s": 5,
            "drain_grace_s": 0,
            **server,
        },
        "policy": {"path": "policy.yaml", "versions_dir": "policy-versions"},
        "stats": {"window_s": 60, "scrape_interval_s": 0.5},
        "backends": backends,
    }
    path = directory / "draftctl.yaml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


def start_daemon(
    directory: Path,
    backends: list[dict[str, Any]],
    token: str | None = None,
    port: int | None = None,
    wait_for: str = "/readyz",
    name: str = "draftctl",
    **server: Any,
) -> Daemon:
    """Start ``draftctl serve`` in ``directory`` and wait until ``wait_for`` answers 200."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port() if port is None else port
    config = write_config(directory, backends, port, **server)
    argv = [sys.executable, "-m", "controller.cli", "serve", "--config", str(config)]
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", TOKEN_ENV: token or ""}
    process = start(name, argv, directory, env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready([(process, url + wait_for)], START_TIMEOUT_S)
    except BaseException:
        process.stop()
        raise
    return Daemon(url, process, directory, token)
