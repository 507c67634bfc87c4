"""PolicyStore against a real temp directory: versions, atomic writes, build-or-nothing."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from controller.policy.document import DEFAULT_POLICY_TEXT
from controller.policy.files import STALE_TEMP_AGE_S, FileSignature
from controller.policy.running import RunningPolicy
from controller.policy.store import PolicyStore, PreconditionFailed, UnknownVersion
from policies.types import Task
from policies.validation import InvalidDocument
from tests.policy_texts import STATIC_POLICY_TEXT

ROOT = Path(__file__).resolve().parents[3]
CHAT_OFF = STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [0, 0, 0, 0]")
CHAT_SMALL = STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [4, 4, 0, 0]")
BAD_BANDS = STATIC_POLICY_TEXT.replace("[8, 32, 64]", "[8, 64, 32]")
GOODPUT = "kind: goodput\ngoodput:\n  cost_table: {table}\n"


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
    seen: list[RunningPolicy] = []
    store.subscribe(seen.append)
    assert store.apply(CHAT_OFF) == 2
    assert (tmp_path / "policy.yaml").read_text() == CHAT_OFF
    assert (tmp_path / "versions" / "v000002.yaml").read_text() == CHAT_OFF
    assert [r.version for r in seen] == [2]
    assert seen[0].spec.static.spec_tokens[Task.CHAT] == [0, 0, 0, 0]
    assert seen[0] is store.running(), "subscribers get the object that runs, built once"
    assert [v["version"] for v in store.versions()] == [2, 1]
    assert store.versions()[0]["is_current"] and not store.versions()[1]["is_current"]
    # no temp files left behind by the atomic writes
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_invalid_change_is_rejected_and_running_policy_stays(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    seen: list[int] = []
    store.subscribe(lambda running: seen.append(running.version))
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

    def unbuildable(spec: object) -> None:
        raise ValueError("policy kind 'static' has no implementation")

    monkeypatch.setattr("controller.policy.build.build_policy", unbuildable)
    with pytest.raises(InvalidDocument) as info:
        store.apply(CHAT_OFF)
    assert info.value.problems[0].path == "kind" and info.value.problems[0].line == 2
    assert "no implementation" in info.value.problems[0].message
    assert store.current()[0] == 1


def _cost_table(tmp_path: Path, case: str) -> str:
    """A goodput cost_table value of each kind that cannot be built (and one that can)."""
    if case == "good":
        shutil.copy(ROOT / "cost_tables" / "qwen3-8b-h200.json", tmp_path / "cost.json")
        return "cost.json"
    if case == "folder":
        (tmp_path / "tables").mkdir()
        return "tables"
    if case == "invalid-json":
        (tmp_path / "cost.json").write_text("{not json")
        return "cost.json"
    return "missing.json"


@pytest.mark.parametrize("case", ["missing", "folder", "invalid-json"])
def test_goodput_cost_table_that_cannot_be_built_changes_nothing(tmp_path: Path, case: str) -> None:
    store = make_store(tmp_path)
    running = store.running()
    text = GOODPUT.format(table=_cost_table(tmp_path, case))
    with pytest.raises(InvalidDocument) as info:
        store.apply(text)
    [problem] = info.value.problems
    assert (problem.path, problem.line) == ("goodput.cost_table", 3)
    assert "cost table" in problem.message
    assert store.running() is running
    assert [v["version"] for v in store.versions()] == [1]
    assert (tmp_path / "policy.yaml").read_text() == DEFAULT_POLICY_TEXT
    again = make_store(tmp_path)  # the daemon still starts afterwards
    assert again.current()[:2] == (1, DEFAULT_POLICY_TEXT)


def test_goodput_with_a_readable_cost_table_runs_its_models(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    assert store.apply(GOODPUT.format(table=_cost_table(tmp_path, "good"))) == 2
    running = store.running()
    assert running.spec.kind == "goodput" and running.models is not None
    assert running.models.cost is not None


def test_empty_text_is_rejected_and_the_file_is_never_empty(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    for text in ("", "  \n\n"):
        with pytest.raises(InvalidDocument, match="empty"):
            store.apply(text)
    assert (tmp_path / "policy.yaml").read_text() == DEFAULT_POLICY_TEXT
    assert store.current()[0] == 1


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o664])
def test_rewriting_the_policy_file_keeps_its_mode(tmp_path: Path, mode: int) -> None:
    store = make_store(tmp_path)
    os.chmod(store.path, mode)
    store.apply(CHAT_OFF)
    store.rollback(1)
    assert stat.S_IMODE(store.path.stat().st_mode) == mode


def test_new_files_get_the_umask_mode_not_0600(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        store = make_store(tmp_path)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "versions" / "v000001.yaml").stat().st_mode) == 0o644


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
    store.subscribe(lambda running: seen.append(running.version))
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


def test_restart_with_unbuildable_file_runs_latest_good_version(tmp_path: Path) -> None:
    make_store(tmp_path)
    (tmp_path / "policy.yaml").write_text(GOODPUT.format(table="missing.json"))
    store = make_store(tmp_path)
    assert store.current()[0] == 1 and store.running().spec.kind == "goodput"  # the default
    assert store.last_file_error is not None
    assert store.last_file_error[0].path == "goodput.cost_table"


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

    def broken(running: RunningPolicy) -> None:
        raise RuntimeError("boom")

    store.subscribe(broken)
    store.subscribe(lambda running: seen.append(running.version))
    assert store.apply(CHAT_OFF) == 2 and seen == [2]


# -- the live file and the store's own writes ----------------------------------------------


def test_store_records_the_signature_of_its_own_write(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.apply(CHAT_OFF)
    data = store.path.read_bytes()
    assert store.written == FileSignature.of(store.path.stat(), data)


def test_file_contents_overwritten_since_the_read_are_not_applied(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.path.write_text(CHAT_SMALL)  # an operator's edit, read by the watcher ...
    data = store.path.read_bytes()
    signature = FileSignature.of(store.path.stat(), data)
    store.apply(CHAT_OFF)  # ... then an admin change replaces the file before it is applied
    assert store.apply_file_bytes(data, signature) == 2
    assert store.current()[:2] == (2, CHAT_OFF) and store.path.read_text() == CHAT_OFF


def test_an_accepted_change_clears_the_stale_file_error(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(InvalidDocument):
        store.apply_file_bytes(BAD_BANDS.encode())
    assert store.last_file_error is not None
    store.apply(CHAT_OFF)  # rewrites the file with an accepted policy
    assert store.last_file_error is None and store.num_rejected_file_changes == 1


def test_start_removes_temp_files_left_by_killed_writes_but_not_young_or_foreign_ones(
    tmp_path: Path,
) -> None:
    make_store(tmp_path).apply(CHAT_OFF)
    versions = tmp_path / "versions"
    stale = [
        tmp_path / ".policy.yaml.0123456789ab.tmp",
        versions / ".v000003.yaml.a1b2c3d4e5f6.tmp",
        versions / ".v000002.json.ffffffffffff.tmp",
    ]
    young = versions / ".v000003.json.abcdefabcdef.tmp"  # maybe another process mid-write
    foreign = [
        tmp_path / ".other.yaml.0123456789ab.tmp",  # not a temp of the policy file
        tmp_path / ".policy.yaml.notahexname.tmp",
        versions / "notes.tmp",
    ]
    aged_s = time.time() - STALE_TEMP_AGE_S - 1
    for path in [*stale, young, *foreign]:
        path.write_text("partial")
        if path is not young:
            os.utime(path, (aged_s, aged_s))
    store = make_store(tmp_path)
    assert store.current()[1] == CHAT_OFF
    assert [p.exists() for p in stale] == [False] * 3
    assert young.exists() and all(p.exists() for p in foreign)
