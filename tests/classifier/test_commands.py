"""`draftctl classify` end to end through the real CLI entry point."""

import json
from pathlib import Path

import pytest

from controller.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(["classify", *argv])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_texts_and_jsonl_give_one_object_per_input_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        {"prompt": "def quicksort(items):\n    if len(items) <= 1:\n        return items\n"},
        {"messages": [{"role": "user", "content": "Write a short poem about the sea at dawn."}]},
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    math = "If 3 apples cost $1.20, how much do 12 apples cost? Show the steps."
    code, out, _ = run(capsys, math, "--jsonl", str(path))
    assert code == 0
    results = [json.loads(line) for line in out]
    assert [r["task"] for r in results] == ["math", "code", "chat"]
    assert all(set(r) == {"task", "confidence"} and 0 <= r["confidence"] <= 1 for r in results)


def test_json_flag_adds_scores_and_latency(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--json", "hello there")
    result = json.loads(out[0])
    assert code == 0 and set(result["scores"]) == {"math", "code", "chat"}
    assert result["latency_us"] > 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ('{"input": "hi"}', '"prompt" or "messages"'),
        ('["a list"]', '"prompt" or "messages"'),
        ('{"messages": "hi"}', '"messages" must be a list'),
    ],
)
def test_bad_jsonl_line_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    code, out, err = run(capsys, "--jsonl", str(path))
    assert code == 2 and out == []
    assert f"{path}:2" in err and message in err


def test_no_input_and_missing_file_are_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys)[0] == 2
    code, _, err = run(capsys, "--jsonl", str(tmp_path / "absent.jsonl"))
    assert code == 2 and "absent.jsonl" in err
