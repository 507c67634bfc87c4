"""``draftctl plan --traffic-log`` on traffic a real daemon recorded (issue 20).

A fresh ``draftctl serve`` (repository config.yaml and policy.yaml, the embedded demo pair on
this CPU, recording on) is driven by ``draftctl bench`` (real prompts from ../shared/data),
stopped, and its served trace planned for a fleet: priced by the trace's own start-up cost
profile (a fleet of such CPU servers) and by the measured Qwen3-8B H200 table (the same traffic
on H200 servers), each as the loop ``--loop auto`` finds and as open-loop arrivals. The trace
is kept beside the plans, so the plans can be made again from it alone:

    .venv/bin/python bench/plan_from_log.py --out-dir results/plan/from-log
    # the plans again from the committed trace, recording nothing:
    .venv/bin/python bench/plan_from_log.py --out-dir results/plan/from-log --keep-trace
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.replay_check import add_record_arguments, record

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_record_arguments(parser)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--cost-table", type=Path, default=ROOT / "cost_tables/qwen3-8b-h200.json")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument(
        "--keep-trace", action="store_true", help="plan from OUT_DIR/served.jsonl, no recording"
    )
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not args.keep_trace:
        with tempfile.TemporaryDirectory() as folder:
            trace = record(Path(folder), args)
            shutil.copy(trace, args.out_dir / "served.jsonl")
            shutil.copy(Path(folder) / "bench" / "bench.json", args.out_dir / "bench.json")
    h200 = ["--cost-table", str(args.cost_table), "--max-batch-size", "128"]
    runs = {
        "cpu-demo": [],
        "h200-8b-table": h200,
        # the same traffic taken as arrivals (--loop open: ranked by mean request latency)
        "cpu-demo-open": ["--loop", "open"],
        "h200-8b-table-open": [*h200, "--loop", "open"],
    }
    for name, extra in runs.items():
        argv = [
            sys.executable, "-m", "controller.cli", "plan", "--traffic-log",
            str(args.out_dir / "served.jsonl"), "--instances", str(args.instances),
            "--window-s", str(args.window_s), "--spill-margin", "auto", "--no-progress",
            "--out-dir", str(args.out_dir / name), *extra,
        ]  # fmt: skip
        done = subprocess.run(argv, check=True, cwd=ROOT, capture_output=True, text=True)
        (args.out_dir / name / "summary.txt").write_text(done.stdout)
        print(f"{name}:\n{done.stdout}", flush=True)
    (args.out_dir / "command.json").write_text(
        json.dumps({"command": " ".join(sys.argv), "settings": vars(args)}, default=str, indent=1)
        + "\n"
    )


if __name__ == "__main__":
    main()
