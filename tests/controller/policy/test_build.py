"""``validate_and_build``: the one accept/reject decision, and the three ways in that use it.

The table at the bottom sends each text through ``PUT /admin/policy``, the file watcher and
``draftctl config check`` and asserts that all three accept or reject it alike.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from controller.admin import AdminAuth, admin_routes
from controller.commands.config import check_command
from controller.policy.build import validate_and_build
from controller.policy.document import DEFAULT_POLICY_TEXT, MAX_POLICY_BYTES, decode_policy
from controller.policy.running import RunningPolicy
from controller.policy.store import PolicyStore
from controller.policy.watcher import PolicyWatcher
from policies.model import PolicySpec
from policies.validation import InvalidDocument

ROOT = Path(__file__).resolve().parents[3]
GOODPUT = "kind: goodput\ngoodput:\n  cost_table: {table}\n"
CONFIG = """\
policy: {path: policy.yaml}
backends:
  - {name: k7, kind: vllm, urls: ["http://127.0.0.1:8101"], model: demo, spec_tokens: 7,
     block_size: 16}
"""


def _folder(tmp_path: Path) -> None:
    """Beside the policy file: a good cost table, a folder and a table that is not JSON."""
    shutil.copy(ROOT / "cost_tables" / "qwen3-8b-h200.json", tmp_path / "cost.json")
    (tmp_path / "tables").mkdir()
    (tmp_path / "bad.json").write_text("{not json")


def test_valid_text_builds_its_policy_and_models(tmp_path: Path) -> None:
    _folder(tmp_path)
    built = validate_and_build(DEFAULT_POLICY_TEXT)
    # The default is goodput without a cost table: models without a cost model until an
    # embedded engine's start-up profile is adopted.
    assert built.spec.kind == "goodput" and built.models is not None
    assert built.models.cost is None
    static = validate_and_build(DEFAULT_POLICY_TEXT.replace("kind: goodput", "kind: static"))
    assert static.spec.kind == "static" and static.models is None
    goodput = validate_and_build(GOODPUT.format(table="cost.json"), base_dir=tmp_path)
    assert goodput.spec.kind == "goodput" and goodput.models is not None
    assert goodput.models.block_size == 16
    assert validate_and_build(DEFAULT_POLICY_TEXT, block_size=8).spec == built.spec


@pytest.mark.parametrize("table", ["missing.json", "tables", "bad.json"])
def test_unreadable_cost_table_names_key_line_and_file(tmp_path: Path, table: str) -> None:
    _folder(tmp_path)
    with pytest.raises(InvalidDocument) as info:
        validate_and_build(GOODPUT.format(table=table), base_dir=tmp_path)
    [problem] = info.value.problems
    assert (problem.path, problem.line) == ("goodput.cost_table", 3)
    assert problem.message.startswith("cost table ") and table in problem.message


def test_empty_and_oversize_texts_are_refused() -> None:
    for text in ("", " \n\t\n"):
        with pytest.raises(InvalidDocument, match="empty"):
            validate_and_build(text)
    big = DEFAULT_POLICY_TEXT + "#" * MAX_POLICY_BYTES
    with pytest.raises(InvalidDocument, match="over the limit"):
        validate_and_build(big)
    with pytest.raises(InvalidDocument, match="over the limit"):
        decode_policy(big.encode())


def test_running_policy_of_a_built_policy_keeps_the_objects() -> None:
    built = validate_and_build(DEFAULT_POLICY_TEXT)
    running = RunningPolicy.of(7, built)
    assert (running.version, running.spec, running.policy) == (7, built.spec, built.policy)
    assert RunningPolicy.build(1, PolicySpec()).spec == PolicySpec()


# -- the three ways in agree -----------------------------------------------------------------

BOMB = "kind: static\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['x'] * 9)}]\n"
    for p, n in zip(["", "a", "b", "c", "d", "e", "f", "g"], "abcdefgh", strict=True)
)
CASES = {
    "static-edited": (DEFAULT_POLICY_TEXT.replace("[7, 4, 4, 0]", "[0, 0, 0, 0]"), True),
    "comments-only": ("# defaults for everything\n", True),
    "goodput-good-table": (GOODPUT.format(table="cost.json"), True),
    "goodput-missing-table": (GOODPUT.format(table="missing.json"), False),
    "goodput-table-folder": (GOODPUT.format(table="tables"), False),
    "goodput-table-not-json": (GOODPUT.format(table="bad.json"), False),
    "bad-bands": (DEFAULT_POLICY_TEXT.replace("[8, 32, 64]", "[8, 64, 32]"), False),
    "unknown-key": ("kind: static\nsurprise: 1\n", False),
    "unknown-kind": ("kind: magic\n", False),
    "broken-yaml": ("kind: static\nstatic: [\n", False),
    "empty": ("", False),
    "alias-bomb": (BOMB, False),
    "deep-nesting": ("[" * 200 + "]" * 200, False),
}


def _put_accepts(folder: Path, text: str) -> bool:
    store = PolicyStore(folder / "policy.yaml", folder / "versions")
    app = Starlette(routes=admin_routes(store, AdminAuth(token=None)))
    client = TestClient(app, client=("127.0.0.1", 50123))
    response = client.put("/admin/policy", content=text.encode())
    assert response.status_code in (200, 422), response.text
    return response.status_code == 200


def _watcher_accepts(folder: Path, text: str) -> bool:
    store = PolicyStore(folder / "policy.yaml", folder / "versions")
    watcher = PolicyWatcher(store, debounce_s=0.0, poll_s=0.1, clock=lambda: 0.0)
    (folder / "policy.yaml").write_text(text)
    watcher.poll_once()
    watcher.poll_once()
    assert watcher.num_reloads + watcher.num_invalid == 1
    return watcher.num_reloads == 1


def _config_check_accepts(folder: Path, text: str, capsys: pytest.CaptureFixture[str]) -> bool:
    (folder / "config.yaml").write_text(CONFIG)
    (folder / "policy.yaml").write_text(text)
    code = check_command(argparse.Namespace(path=folder / "config.yaml"))
    capsys.readouterr()
    return code == 0


@pytest.mark.parametrize("case", list(CASES))
def test_put_watcher_and_config_check_agree(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text, accepted = CASES[case]
    answers = {}
    for name, way in [("put", _put_accepts), ("watcher", _watcher_accepts)]:
        folder = tmp_path / name
        folder.mkdir()
        _folder(folder)
        answers[name] = way(folder, text)
    folder = tmp_path / "check"
    folder.mkdir()
    _folder(folder)
    answers["config check"] = _config_check_accepts(folder, text, capsys)
    assert answers == dict.fromkeys(answers, accepted)
