"""bench/plain_step_gpu.sh (one H200 call's plan) on the CPU with a stand-in interpreter: each
part runs the bench it names with the arguments it documents, reports its exit status, and
the script exits with the last failure."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(
    tmp_path: Path, fail: str = "", **env: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    calls = tmp_path / "calls.log"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {calls}\n'
        'echo "last line of $1"\n'
        f'case "$*" in *"{fail or "NEVER"}"*) exit 3;; esac\n'
    )
    fake.chmod(0o755)
    environment = {**os.environ, "OUT": str(tmp_path / "out"), "PY": str(fake), **env}
    done = subprocess.run(
        ["bash", "bench/plain_step_gpu.sh"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, calls.read_text() if calls.exists() else ""


def test_every_part_runs_its_bench_and_reports_it(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, TRACE_BATCHES="1 8")
    assert done.returncode == 0, done.stderr
    lines = calls.splitlines()
    assert lines[0].startswith("bench/gemv_gpu.py --shapes qwen3-8b --every-config")
    assert lines[1].startswith("bench/decode_gpu.py") and "--linear aten,fused" in lines[1]
    assert lines[2].startswith("bench/plain_step_trace.py --batch 1 ") and "--trace" in lines[2]
    assert lines[3].startswith("bench/plain_step_trace.py --batch 8 ") and "--trace" not in lines[3]
    assert lines[4].startswith("bench/plain_step_trace.py --batch 1 --k 15")
    assert len(lines) == 5
    for part in (
        "gemv_gpu: exit 0",
        "decode_gpu: exit 0",
        "plain_step_trace b8: exit 0",
        "spec_step_trace b1: exit 0",
    ):
        assert part in done.stdout


def test_parts_can_be_skipped_and_a_failure_is_the_exit_status(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, fail="--k 15", GEMV="0", DECODE="0", TRACE="0")
    assert done.returncode == 3
    assert calls.splitlines() == [calls.splitlines()[0]] and "--k 15" in calls
    assert "spec_step_trace b1: exit 3" in done.stdout
