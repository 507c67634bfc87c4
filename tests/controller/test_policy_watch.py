"""PolicyWatcher's polling cost: an old, unchanged file is only stat'ed, a fresh one hashed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from controller.policy_store import DEFAULT_POLICY_TEXT, PolicyStore
from controller.policy_watch import PolicyWatcher

CHAT_OFF = DEFAULT_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [0, 0, 0, 0]")
CHAT_LOW = DEFAULT_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [4, 4, 4, 0]")


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    reads: list[Path] = []
    read_bytes = Path.read_bytes

    def counting(path: Path) -> bytes:
        reads.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counting)
    return reads


def test_old_unchanged_file_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = PolicyStore(tmp_path / "policy.yaml", tmp_path / "versions")
    old_ns = time.time_ns() - 60 * 10**9
    os.utime(store.path, ns=(old_ns, old_ns))
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=Clock())
    reads = _count_reads(monkeypatch)
    for _ in range(20):
        watcher.poll_once()
    assert reads == []
    store.path.write_text(CHAT_OFF)  # a real edit is still picked up
    watcher.poll_once()
    watcher.poll_once()
    assert store.current()[:2] == (2, CHAT_OFF)
    assert len(reads) >= 1


def test_same_size_edit_within_one_mtime_is_seen(tmp_path: Path) -> None:
    assert len(CHAT_OFF) == len(CHAT_LOW)
    store = PolicyStore(tmp_path / "policy.yaml", tmp_path / "versions")
    clock = Clock()
    store.path.write_text(CHAT_OFF)
    mtime_ns = store.path.stat().st_mtime_ns
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=clock)
    store.path.write_text(CHAT_LOW)
    os.utime(store.path, ns=(mtime_ns, mtime_ns))  # same size, same mtime: only the hash differs
    watcher.poll_once()
    watcher.poll_once()
    assert store.current()[:2] == (2, CHAT_LOW)
