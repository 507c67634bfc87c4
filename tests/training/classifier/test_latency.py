"""The lean-process latency measurement that `draftctl classifier eval` runs."""

import json
import re
from pathlib import Path

import pytest

from training.classifier.latency import main


def test_times_every_request_and_long_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bodies = [
        {"prompt": "def add(a, b):\n    return a + b\n" * 40},
        {"messages": [{"role": "user", "content": "Write a poem about the sea. " * 150}]},
        {"messages": [{"role": "user", "content": "What is 17 * 23?"}]},
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(body) + "\n" for body in bodies))
    main([str(path)])
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        r"latency per held-out request: p50 [\d.]+ us  p99 [\d.]+ us  \(n=3\)", out[0]
    )
    # The texts joined reach 4,000 characters: 2,000 timed calls of such prompts.
    assert re.fullmatch(r"latency per 4000-character prompt: p50 .* \(n=2000\)", out[1])
