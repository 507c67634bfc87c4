"""PolicyStore and PolicyWatcher against a real temp directory."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from controller.policy_store import (
    DEFAULT_POLICY_TEXT,
    PolicyStore,
    PreconditionFailed,
    UnknownVersion,
)
from controller.policy_watch import PolicyWatcher
from policies.model import PolicySpec
from policies.types import Task
from policies.validation import InvalidDocument

CHAT_OFF = DEFAULT_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [0, 0, 0, 0]")
CHAT_SMALL = DEFAULT_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [4, 4, 0, 0]")
BAD_BANDS = DEFAULT_POLICY_TEXT.replace("[8, 32, 64]", "[8, 64, 32]")


def make_store(tmp_path: Path, **kwargs: object) -> PolicyStore:
    return PolicyStore(tmp_path / "policy.yaml", tmp_path / "versions", **kwargs)  # type: ignore[arg-type]


def test_first_start_writes_default_as_version_1(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    version, text, spec = store.current()
    assert (version, text) == (1, DEFAULT_POLICY_TEXT)
    assert spec.static.spec_tokens[Task.CHAT] == [7, 4, 4, 0]
    assert (tmp_path / "policy.yaml").read_text() == DEFAULT_POLICY_TEXT
    assert (tmp_path / "versions" / "v000001.yaml").read_text() == DEFAULT_POLICY_TEXT
    meta = json.loads((tmp_path / "versions" / "v000001.json").read_text())
    assert meta["source"] == "default" and meta["version"] == 1


def test_apply_writes_file_and_new_version_and_notifies(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    seen: list[tuple[PolicySpec, int]] = []
    store.subscribe(lambda spec, version: seen.append((spec, version)))
    assert store.apply(CHAT_OFF) == 2
    assert (tmp_path / "policy.yaml").read_text() == CHAT_OFF
    assert (tmp_path / "versions" / "v000002.yaml").read_text() == CHAT_OFF
    assert [v for _, v in seen] == [2]
    assert seen[0][0].static.spec_tokens[Task.CHAT] == [0, 0, 0, 0]
    assert [v["version"] for v in store.versions()] == [2, 1]
    assert store.versions()[0]["is_current"] and not store.versions()[1]["is_current"]
    # no temp files left behind by the atomic writes
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_invalid_change_is_rejected_and_running_policy_stays(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    seen: list[int] = []
    store.subscribe(lambda spec, version: seen.append(version))
    with pytest.raises(InvalidDocument) as info:
        store.apply(BAD_BANDS)
    problem = info.value.problems[0]
    assert problem.path == "static.concurrency_bands"
    assert "ascending" in problem.message and problem.line == 6
    assert store.current()[0] == 1 and store.current()[1] == DEFAULT_POLICY_TEXT
    assert (tmp_path / "policy.yaml").read_text() == DEFAULT_POLICY_TEXT
    assert [v["version"] for v in store.versions()] == [1] and seen == []


def test_policy_that_cannot_be_built_is_rejected_with_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path)

    def unbuildable(spec: PolicySpec) -> None:
        raise ValueError(f"policy kind {spec.kind!r} has no implementation")

    monkeypatch.setattr("controller.policy_store.build_policy", unbuildable)
    with pytest.raises(InvalidDocument) as info:
        store.apply(CHAT_OFF)
    assert info.value.problems[0].path == "kind" and info.value.problems[0].line == 2
    assert "no implementation" in info.value.problems[0].message
    assert store.current()[0] == 1


def test_if_match_and_etag(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    old_etag = store.etag()
    assert store.apply(CHAT_OFF, if_match=old_etag) == 2
    assert store.etag() != old_etag
    with pytest.raises(PreconditionFailed) as info:
        store.apply(CHAT_SMALL, if_match=old_etag)
    assert info.value.current_etag == store.etag()
    assert store.current()[0] == 2
    assert store.apply(CHAT_SMALL, if_match="*") == 3
    assert store.apply(CHAT_OFF, if_match=f'"nope", {store.etag()}') == 4


def test_same_text_is_a_no_op(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    seen: list[int] = []
    store.subscribe(lambda spec, version: seen.append(version))
    assert store.apply(DEFAULT_POLICY_TEXT) == 1
    assert seen == [] and len(store.versions()) == 1


def test_rollback_is_a_new_version_with_the_old_text(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.apply(CHAT_OFF)
    store.apply(CHAT_SMALL)
    assert store.rollback(1) == 4
    assert store.current()[1] == DEFAULT_POLICY_TEXT
    assert (tmp_path / "policy.yaml").read_text() == DEFAULT_POLICY_TEXT
    assert store.versions()[0]["source"] == "rollback:1"
    with pytest.raises(UnknownVersion):
        store.rollback(99)


def test_restart_resumes_numbering_and_keeps_current(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.apply(CHAT_OFF)
    again = make_store(tmp_path)
    assert again.current()[0] == 2 and again.current()[1] == CHAT_OFF
    assert again.apply(CHAT_SMALL) == 3


def test_restart_with_edited_file_records_it(tmp_path: Path) -> None:
    make_store(tmp_path)
    (tmp_path / "policy.yaml").write_text(CHAT_OFF)
    store = make_store(tmp_path)
    assert store.current()[:2] == (2, CHAT_OFF)
    assert store.versions()[0]["source"] == "file"


def test_restart_with_invalid_file_runs_latest_good_version(tmp_path: Path) -> None:
    make_store(tmp_path).apply(CHAT_OFF)
    (tmp_path / "policy.yaml").write_text(BAD_BANDS)
    store = make_store(tmp_path)
    assert store.current()[:2] == (2, CHAT_OFF)
    assert store.last_file_error is not None
    assert store.last_file_error[0].path == "static.concurrency_bands"
    # the operator's broken file is left for them to fix, not overwritten
    assert (tmp_path / "policy.yaml").read_text() == BAD_BANDS


def test_first_start_with_invalid_file_fails_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("kind: static\nbogus: 1\n")
    with pytest.raises(InvalidDocument, match=r"bogus: unknown key \(line 2\)"):
        make_store(tmp_path)


def test_old_versions_are_pruned(tmp_path: Path) -> None:
    store = make_store(tmp_path, max_versions=2)
    store.apply(CHAT_OFF)
    store.apply(CHAT_SMALL)
    assert [v["version"] for v in store.versions()] == [3, 2]
    assert not (tmp_path / "versions" / "v000001.yaml").exists()


def test_failing_subscriber_does_not_block_others(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    seen: list[int] = []

    def broken(spec: PolicySpec, version: int) -> None:
        raise RuntimeError("boom")

    store.subscribe(broken)
    store.subscribe(lambda spec, version: seen.append(version))
    assert store.apply(CHAT_OFF) == 2 and seen == [2]


# -- the file watcher --------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


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


def test_watcher_ignores_the_stores_own_writes(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    clock = FakeClock()
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=clock)
    store.apply(CHAT_OFF)  # rewrites policy.yaml
    watcher.poll_once()
    watcher.poll_once()
    assert store.current()[0] == 2 and len(store.versions()) == 2
    assert (watcher.num_reloads, watcher.num_invalid) == (0, 0)


async def test_watch_task_reloads_a_real_edit(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    changed = asyncio.Event()
    store.subscribe(lambda spec, version: changed.set())
    task = asyncio.create_task(store.watch(debounce_s=0.05, poll_s=0.02))
    try:
        await asyncio.sleep(0.05)
        (tmp_path / "policy.yaml").write_text(CHAT_SMALL)
        await asyncio.wait_for(changed.wait(), timeout=5)
        assert store.current()[:2] == (2, CHAT_SMALL)
    finally:
        task.cancel()
