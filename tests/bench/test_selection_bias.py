"""bench/selection_bias.py's own arithmetic and argument checks (its harness call takes minutes
on the CPU: run by hand, its JSON committed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.selection_bias import parse_args, summarise


def test_summary_counts_the_first_position_and_the_mean() -> None:
    got = summarise([1, 2, 3, 1, 8])
    assert got == {"row_steps": 5, "mean_accept": 3.0, "first_position_accepted": 0.6}


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--prompts", str(tmp_path / "missing.jsonl"), "--out", "x"])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"task": "math", "prompt": "1+1?"}\n')
    with pytest.raises(SystemExit):
        parse_args(["--prompts", str(prompts), "--out", "x", "--scale", "0"])
    assert parse_args(["--prompts", str(prompts), "--out", "x"]).device == "cpu"
