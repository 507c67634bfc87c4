"""SIGKILL while the admin API writes policies: the policy file and every kept version are
always one whole accepted document, and the daemon starts again on them. Also issue 15's
admin reproducers that need a restart or a daemon without a token (items 6 and 8).

The daemon has one pool whose server is down (no engine to load: it starts in ~2 s, and the
policy store is the same whatever the backends). ``DRAFTCTL_KILL_ROUNDS`` kills (3 in CI).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from controller.policy.document import DEFAULT_POLICY_TEXT
from controller.policy.files import STALE_TEMP_AGE_S
from tests.policy_texts import STATIC_POLICY_TEXT
from tests.robustness.daemon import Daemon, pool_backend, start_daemon
from tests.robustness.report import record, size
from tests.robustness.verdict import openai_error

pytestmark = pytest.mark.slow

NUM_ROUNDS = size("DRAFTCTL_KILL_ROUNDS")
NUM_WRITERS = 3
DEAD_POOL = [pool_backend("p", "http://127.0.0.1:9", 7)]  # nothing listens on port 9
VERSION_FILE = re.compile(r"^v\d{6,}\.(yaml|json)$")


def start(directory: Path, name: str) -> Daemon:
    return start_daemon(directory, DEAD_POOL, wait_for="/healthz", name=name)


def call(
    daemon: Daemon, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, bytes]:
    request = urllib.request.Request(daemon.url + path, body, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def document(writer: int, n: int) -> str:
    chat = [7, 4, 4, n % 5]
    return STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", f"chat: {chat}  # {writer}-{n}")


def write_until_killed(
    daemon: Daemon, writer: int, sent: set[str], accepted: list[int], stop: threading.Event
) -> None:
    for n in range(10**9):
        if stop.is_set():
            return
        text = document(writer, n)
        sent.add(text)
        try:
            status, _ = call(daemon, "PUT", "/admin/policy", text.encode())
        except (OSError, http.client.HTTPException):  # killed mid-request
            return
        if status == 200:
            accepted.append(n)


def assert_whole(directory: Path, sent: set[str]) -> int:
    """The file and every kept version are documents that were sent whole; returns how many
    leftover temp files the kills left (never read: hidden ``.*.tmp`` names)."""
    assert (directory / "policy.yaml").read_text() in sent
    versions = directory / "policy-versions"
    for path in versions.iterdir():
        if path.suffix == ".yaml" and VERSION_FILE.match(path.name):
            assert path.read_text() in sent, path
        elif path.suffix == ".json" and VERSION_FILE.match(path.name):
            assert json.loads(path.read_text())["version"] >= 1
    return len(temp_files(directory))


def temp_files(directory: Path) -> list[Path]:
    versions = directory / "policy-versions"
    return [p for p in [*versions.iterdir(), *directory.iterdir()] if p.name.endswith(".tmp")]


def test_sigkill_during_policy_writes_never_tears_the_file(tmp_path: Path) -> None:
    rng = random.Random()
    sent = {DEFAULT_POLICY_TEXT}
    num_accepted = num_temps = 0
    for round_ in range(NUM_ROUNDS):
        daemon = start(tmp_path, f"kill-{round_}")
        try:
            assert_whole(tmp_path, sent)
            accepted: list[int] = []
            stop = threading.Event()
            writers = [
                threading.Thread(target=write_until_killed, args=(daemon, w, sent, accepted, stop))
                for w in range(NUM_WRITERS)
            ]
            for writer in writers:
                writer.start()
            time.sleep(rng.uniform(0.3, 1.0))
            daemon.process.kill(signal.SIGKILL)
            stop.set()
            for writer in writers:
                writer.join(15)
            daemon.process.popen.wait(10)
        finally:
            daemon.stop()
        assert accepted, f"round {round_}: no write was accepted before the kill"
        num_accepted += len(accepted)
        num_temps = assert_whole(tmp_path, sent)
    # A restart removes the temp files that kills left, once older than any write can take
    # (STALE_TEMP_AGE_S); a real restart after a crash is later than that, here they are aged.
    aged_s = time.time() - STALE_TEMP_AGE_S - 1
    for leftover in temp_files(tmp_path):
        os.utime(leftover, (aged_s, aged_s))
    daemon = start(tmp_path, "kill-final")
    try:
        status, text = call(daemon, "GET", "/admin/policy")
        assert status == 200 and text.decode() == (tmp_path / "policy.yaml").read_text()
        assert temp_files(tmp_path) == []
    finally:
        daemon.stop()
    figures = {"rounds": NUM_ROUNDS, "restarts": NUM_ROUNDS, "accepted_writes": num_accepted}
    record(
        "policy_kill",
        {
            **figures,
            "torn_files": 0,
            "leftover_temp_files": num_temps,
            "temp_files_after_restart": 0,
        },
    )


def test_unbuildable_policies_change_nothing_and_the_daemon_restarts(tmp_path: Path) -> None:
    """Item 6: a goodput policy whose cost_table is missing, a folder or not JSON was a 200
    (and /validate said ok), and the daemon then refused to start."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "bad.json").write_text("{not json")
    daemon = start(tmp_path, "unbuildable")
    try:
        before = call(daemon, "GET", "/admin/policy/versions")[1]
        for table in (tmp_path / "missing.json", tmp_path / "folder", tmp_path / "bad.json"):
            text = f"kind: goodput\ngoodput:\n  cost_table: {table}\n".encode()
            status, body = call(daemon, "PUT", "/admin/policy", text)
            error = openai_error(body)
            assert status == 422 and error and error["code"] == "invalid_policy", body
            status, body = call(daemon, "POST", "/admin/policy/validate", text)
            assert status == 200 and json.loads(body)["ok"] is False
        assert call(daemon, "GET", "/admin/policy/versions")[1] == before
        assert (tmp_path / "policy.yaml").read_text() == DEFAULT_POLICY_TEXT
    finally:
        assert daemon.stop() == 0
    daemon = start(tmp_path, "unbuildable-restart")
    assert daemon.stop() == 0


def test_a_tokenless_admin_api_refuses_forwarded_remote_clients(tmp_path: Path) -> None:
    """Item 8: loopback-only admin honoured X-Forwarded-For but ignored ``Forwarded:``."""
    daemon = start(tmp_path, "forwarded")
    try:
        for header, value in (
            ("Forwarded", "for=203.0.113.7"),
            ("Forwarded", 'for="[2001:db8::1]:4711"'),
            ("Forwarded", "for=unknown"),
            ("Forwarded", "proto=https"),
            ("X-Forwarded-For", "203.0.113.7, 127.0.0.1"),
        ):
            status, body = call(daemon, "GET", "/admin/policy", **{header: value})
            error = openai_error(body)
            assert status == 403 and error and error["code"] == "admin_loopback_only", value
        assert call(daemon, "GET", "/admin/policy", Forwarded="for=127.0.0.1")[0] == 200
    finally:
        daemon.stop()
