"""Cost-table files: T(batch, tokens per request) measured on an engine, read from JSON.

The table itself (``policies.costmodel.CostTable``) is pure; reading the file happens here, in
the daemon's policy lifecycle and in the tools, never in a policy.
"""

from __future__ import annotations

import json
from pathlib import Path

from policies.costmodel import CostTable
from policies.model import GoodputSpec


def load_cost_table(path: str | Path) -> CostTable:
    """Read a cost table JSON file; errors name the file and what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cost table {path}: cannot read it ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"cost table {path}: expected a JSON object")
    try:
        return CostTable.from_dict(data, source=str(path))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cost table {path}: {exc}") from exc


def goodput_cost_table(spec: GoodputSpec, base_dir: str | Path = ".") -> CostTable | None:
    """The goodput policy's ``cost_table`` (relative to ``base_dir``, the policy file's folder),
    or None when the policy names none."""
    if not spec.cost_table:
        return None
    path = Path(spec.cost_table)
    return load_cost_table(path if path.is_absolute() else Path(base_dir) / path)
