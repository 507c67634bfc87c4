"""``draftctl config check`` validates the policy file the config points to, too."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from controller.commands.config import check_command
from controller.policy.document import DEFAULT_POLICY_TEXT
from tests.policy_texts import STATIC_POLICY_TEXT

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """\
policy: {path: rules/policy.yaml}
backends:
  - {name: k7, kind: vllm, urls: ["http://127.0.0.1:8101"], model: demo, spec_tokens: 7,
     block_size: 16}
"""
BAD_BANDS = STATIC_POLICY_TEXT.replace("[8, 32, 64]", "[8, 64, 32]")


def _check(
    tmp_path: Path, policy: str | bytes | None, capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[str]]:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    if policy is not None:
        (tmp_path / "rules").mkdir()
        path = tmp_path / "rules" / "policy.yaml"
        path.write_bytes(policy if isinstance(policy, bytes) else policy.encode())
    code = check_command(argparse.Namespace(path=config))
    return code, capsys.readouterr().out.splitlines()


def test_valid_or_absent_policy_is_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _check(tmp_path, None, capsys) == (0, ["ok"])  # serve would create the default
    assert _check(tmp_path, DEFAULT_POLICY_TEXT, capsys) == (0, ["ok"])


def test_policy_problems_name_the_file_key_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = _check(tmp_path, BAD_BANDS + "surprise: 1\n", capsys)
    prefix = f"policy file {tmp_path / 'rules' / 'policy.yaml'}: "
    assert code == 1 and len(lines) == 2
    assert all(line.startswith(prefix) for line in lines)
    assert lines[0].startswith(prefix + "static.concurrency_bands: ") and lines[0].endswith(
        "(line 6)"
    )
    last_line = len((BAD_BANDS + "surprise: 1\n").splitlines())
    assert lines[1] == prefix + f"surprise: unknown key (line {last_line})"


def test_unreadable_policy_contents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _check(tmp_path, b"kind: \xff\n", capsys)
    assert code == 1 and len(lines) == 1 and "not UTF-8" in lines[0]


def test_goodput_cost_table_that_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = _check(tmp_path, "kind: goodput\ngoodput:\n  cost_table: none.json\n", capsys)
    assert code == 1 and len(lines) == 1
    # The problem names the dotted key and its line, like every other policy problem.
    assert "goodput.cost_table: cost table" in lines[0] and "none.json" in lines[0]
    assert lines[0].endswith("(line 3)")


def test_empty_policy_file_is_a_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _check(tmp_path, "", capsys)
    assert code == 1 and len(lines) == 1 and "empty" in lines[0]


def test_cli_exit_code_and_output(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "policy.yaml").write_text("kind: magic\n")
    result = subprocess.run(
        [sys.executable, "-m", "controller.cli", "config", "check", str(tmp_path / "config.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stdout.startswith("policy file ") and "kind: " in result.stdout
    assert "(line 1)" in result.stdout
