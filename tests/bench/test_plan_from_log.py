"""bench/plan_from_log.py --keep-trace: the plans made again from a committed served trace
(recording one needs a daemon; that part is bench/replay_check.py's ``record``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_plans_are_made_from_the_kept_trace(tmp_path: Path) -> None:
    out = tmp_path / "from-log"
    out.mkdir()
    trace = ROOT / "results" / "plan" / "from-log" / "served.jsonl"
    shutil.copy(trace, out / "served.jsonl")
    bench = [sys.executable, "bench/plan_from_log.py", "--out-dir", str(out), "--keep-trace"]
    subprocess.run(bench, cwd=ROOT, check=True, capture_output=True)
    for name in ("cpu-demo", "h200-8b-table", "cpu-demo-open", "h200-8b-table-open"):
        plan = json.loads((out / name / "plan.json").read_text())
        committed = json.loads((trace.parent / name / "plan.json").read_text())
        assert plan["traffic_log"]["requests"] == 145
        # the bench's clients chain their requests: planned as a closed loop, by goodput
        loop = "open" if name.endswith("-open") else "closed"
        assert plan["traffic_log"]["loop"] == loop
        assert plan["objective"] == {"open": "latency", "closed": "goodput"}[loop]
        assert plan["objective"] == committed["objective"]
        # deterministic: the committed plans are what this code makes from that trace
        assert plan["recommended"] == committed["recommended"]
        assert plan["full_length"] == committed["full_length"]
        assert (out / name / "summary.txt").read_text().startswith("recommended for 4 instances")
    assert json.loads((out / "command.json").read_text())["settings"]["instances"] == 4
