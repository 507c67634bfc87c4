"""PolicyWatcher against a real temp directory: debounce, invalid files, the store's own
writes, and its polling cost (an old, unchanged file is only stat'ed, a fresh one hashed)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from controller.policy import build as build_module
from controller.policy.build import BuiltPolicy
from controller.policy.document import DEFAULT_POLICY_TEXT
from controller.policy.running import RunningPolicy
from controller.policy.store import PolicyStore
from controller.policy.watcher import PolicyWatcher
from tests.policy_texts import STATIC_POLICY_TEXT

CHAT_OFF = STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [0, 0, 0, 0]")
CHAT_SMALL = STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [4, 4, 0, 0]")
CHAT_LOW = STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [4, 4, 4, 0]")
BAD_BANDS = STATIC_POLICY_TEXT.replace("[8, 32, 64]", "[8, 64, 32]")


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def make_store(tmp_path: Path) -> PolicyStore:
    return PolicyStore(tmp_path / "policy.yaml", tmp_path / "versions")


def test_watcher_debounces_then_reloads(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    clock = FakeClock()
    watcher = PolicyWatcher(store, debounce_s=1.0, poll_s=0.1, clock=clock)
    (tmp_path / "policy.yaml").write_text("kind: sta")  # an editor's half-written save
    watcher.poll_once()
    clock.now_s = 0.5
    (tmp_path / "policy.yaml").write_text(CHAT_OFF)
    watcher.poll_once()  # changed again: the debounce restarts
    clock.now_s = 1.2
    watcher.poll_once()
    assert store.current()[0] == 1, "applied before the file settled for debounce_s"
    clock.now_s = 1.6
    watcher.poll_once()
    assert store.current()[:2] == (2, CHAT_OFF)
    assert (watcher.num_reloads, watcher.num_invalid) == (1, 0)


def test_watcher_counts_invalid_file_once_and_keeps_policy(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    clock = FakeClock()
    watcher = PolicyWatcher(store, debounce_s=0.2, poll_s=0.1, clock=clock)
    (tmp_path / "policy.yaml").write_text(BAD_BANDS)
    for step in range(10):
        clock.now_s = step * 0.1
        watcher.poll_once()
    assert store.current()[0] == 1
    assert watcher.num_invalid == 1 and store.num_rejected_file_changes == 1
    assert store.last_file_error is not None
    assert store.last_file_error[0].line == 6
    (tmp_path / "policy.yaml").write_text(CHAT_OFF)  # fixed: applies and clears the error
    for step in range(10, 20):
        clock.now_s = step * 0.1
        watcher.poll_once()
    assert store.current()[0] == 2 and store.last_file_error is None


def test_watcher_rejects_non_utf8_file(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    clock = FakeClock()
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=clock)
    (tmp_path / "policy.yaml").write_bytes(b"kind: \xff\xfe\n")
    watcher.poll_once()
    watcher.poll_once()
    assert watcher.num_invalid == 1 and store.current()[0] == 1
    assert store.last_file_error is not None and "UTF-8" in store.last_file_error[0].message


def test_watcher_rejects_an_emptied_file(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=FakeClock())
    (tmp_path / "policy.yaml").write_text("")
    watcher.poll_once()
    watcher.poll_once()
    assert watcher.num_invalid == 1 and store.current()[:2] == (1, DEFAULT_POLICY_TEXT)


def test_watcher_ignores_the_stores_own_writes(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    clock = FakeClock()
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=clock)
    store.apply(CHAT_OFF)  # rewrites policy.yaml
    watcher.poll_once()
    watcher.poll_once()
    assert store.current()[0] == 2 and len(store.versions()) == 2
    assert (watcher.num_reloads, watcher.num_invalid) == (0, 0)


def test_an_api_change_is_built_once_and_never_rebuilt_by_the_watcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path)
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=FakeClock())
    built: list[str] = []
    real = build_module.validate_and_build

    def counting(text: str, **kwargs: object) -> BuiltPolicy:
        built.append(text)
        return real(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("controller.policy.store.validate_and_build", counting)
    store.apply(CHAT_OFF)
    running = store.running()
    for _ in range(3):
        watcher.poll_once()
    assert built == [CHAT_OFF], "the store's own write was read back as an edit"
    assert store.running() is running and store.versions()[0]["source"] == "api"


def test_an_api_change_replaces_a_pending_file_edit(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    clock = FakeClock()
    watcher = PolicyWatcher(store, debounce_s=1.0, poll_s=0.1, clock=clock)
    store.path.write_text(CHAT_SMALL)
    watcher.poll_once()  # the edit is seen, waiting to settle ...
    store.apply(CHAT_OFF)  # ... when an admin change overwrites the file
    for step in range(1, 30):
        clock.now_s = step * 0.1
        watcher.poll_once()
    assert store.current()[:2] == (2, CHAT_OFF) and store.path.read_text() == CHAT_OFF
    assert [v["source"] for v in store.versions()] == ["api", "default"]


async def test_watch_task_reloads_a_real_edit(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    changed = asyncio.Event()
    loop = asyncio.get_running_loop()
    # the watcher polls on a worker thread: hop back to the loop to set the event
    store.subscribe(lambda running: loop.call_soon_threadsafe(changed.set))
    task = asyncio.create_task(PolicyWatcher(store, debounce_s=0.05, poll_s=0.02).run())
    try:
        await asyncio.sleep(0.05)
        (tmp_path / "policy.yaml").write_text(CHAT_SMALL)
        await asyncio.wait_for(changed.wait(), timeout=5)
        assert store.current()[:2] == (2, CHAT_SMALL)
    finally:
        task.cancel()


# -- polling cost --------------------------------------------------------------------------


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    reads: list[Path] = []
    read_bytes = Path.read_bytes

    def counting(path: Path) -> bytes:
        reads.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counting)
    return reads


def test_old_unchanged_file_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(tmp_path)
    old_ns = time.time_ns() - 60 * 10**9
    os.utime(store.path, ns=(old_ns, old_ns))
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=FakeClock())
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
    store = make_store(tmp_path)
    clock = FakeClock()
    store.path.write_text(CHAT_OFF)
    mtime_ns = store.path.stat().st_mtime_ns
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=clock)
    store.path.write_text(CHAT_LOW)
    os.utime(store.path, ns=(mtime_ns, mtime_ns))  # same size, same mtime: only the hash differs
    watcher.poll_once()
    watcher.poll_once()
    assert store.current()[:2] == (2, CHAT_LOW)


def test_subscribers_get_the_running_policy(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=FakeClock())
    seen: list[RunningPolicy] = []
    store.subscribe(seen.append)
    store.path.write_text(CHAT_OFF)
    watcher.poll_once()
    watcher.poll_once()
    assert [r.version for r in seen] == [2] and seen[0] is store.running()
