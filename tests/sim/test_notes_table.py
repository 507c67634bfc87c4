"""The committed derived cost table still matches the GPU notes it was built from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.notes_table import MEASURED_RATIO, PLAIN_STEP_B1_S, build

COMMITTED = Path(__file__).resolve().parents[2] / "scenarios/cost/qwen3-8b-h200-from-notes.json"


def test_committed_file_is_what_the_generator_writes() -> None:
    assert json.loads(COMMITTED.read_text()) == json.loads(json.dumps(build()))


def test_measured_cells_keep_the_measured_ratios() -> None:
    table = build()
    rows = dict(zip(table["batch_sizes"], table["step_time_s"], strict=True))
    tokens = table["tokens_per_request"]
    assert rows[1][0] == pytest.approx(PLAIN_STEP_B1_S)
    for (batch, width), ratio in MEASURED_RATIO.items():
        row = rows[batch]
        assert row[tokens.index(width)] / row[0] == pytest.approx(ratio, rel=1e-4)
    # Every row is increasing in tokens per request and every column in batch size.
    for row in table["step_time_s"]:
        assert row == sorted(row)
    for column in zip(*table["step_time_s"], strict=True):
        assert list(column) == sorted(column)
