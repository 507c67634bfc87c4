"""Start, wait for and stop the real servers of the integration suite (bounded, always reaped)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Process:
    """A child started in its own process group (vLLM forks engine and worker processes)."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, num_lines: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-num_lines:])

    def is_running(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group this process leads; only processes we started are in it."""
        if self.is_running():
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the group, then SIGKILL it if it has not exited within ``timeout_s``."""
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        # The leader may be gone while forked children linger: kill the group regardless.
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.popen.poll() is None:
            self.popen.wait(timeout=timeout_s)


def start(name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str]) -> Process:
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            start_new_session=True,
        )
    return Process(name, popen, log_path)


def wait_ready(processes: Sequence[tuple[Process, str]], timeout_s: float) -> float:
    """Poll each ``(process, url)`` until the URL answers 200; returns the seconds it took.

    Fails fast with the log tail when a process exits, and after ``timeout_s`` otherwise.
    """
    started = time.monotonic()
    pending = list(processes)
    while pending:
        for process, url in list(pending):
            if not process.is_running():
                raise RuntimeError(
                    f"{process.name} exited with {process.popen.returncode} before it was "
                    f"ready; log {process.log_path}:\n{process.log_tail()}"
                )
            if _answers_200(url):
                pending.remove((process, url))
        if time.monotonic() - started > timeout_s:
            names = ", ".join(p.name for p, _ in pending)
            tails = "\n".join(f"--- {p.name}\n{p.log_tail()}" for p, _ in pending)
            raise TimeoutError(f"{names} not ready after {timeout_s:.0f} s:\n{tails}")
        if pending:
            time.sleep(0.5)
    return time.monotonic() - started


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
