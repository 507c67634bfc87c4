"""Reading cost-table files (the policies only ever see the parsed table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.cost_tables import goodput_cost_table, load_cost_table
from policies.model import GoodputSpec


def test_load_cost_table_names_the_file_and_problem(tmp_path: Path) -> None:
    good = tmp_path / "t.json"
    good.write_text(
        json.dumps(
            {
                "batch_sizes": [1, 2],
                "tokens_per_request": [1, 16],
                "unit": "s",
                "step_time_s": [[1.0, 2.0], [1.5, 3.0]],
            }
        )
    )
    assert load_cost_table(good).time_s(2, 16) == 3.0
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {"batch_sizes": [1, 2], "tokens_per_request": [1, 16], "step_time_s": [[1.0, 2.0]]}
        )
    )
    with pytest.raises(ValueError, match=r"bad\.json.*1 rows"):
        load_cost_table(bad)
    with pytest.raises(ValueError, match="cannot read"):
        load_cost_table(tmp_path / "missing.json")


def test_goodput_cost_table_is_relative_to_the_policy_folder(tmp_path: Path) -> None:
    assert goodput_cost_table(GoodputSpec()) is None
    (tmp_path / "t.json").write_text(
        json.dumps(
            {
                "batch_sizes": [1, 2],
                "tokens_per_request": [1, 16],
                "step_time_s": [[1.0, 2.0], [1.5, 3.0]],
            }
        )
    )
    table = goodput_cost_table(GoodputSpec(cost_table="t.json"), tmp_path)
    assert table is not None and table.time_s(1, 1) == 1.0
