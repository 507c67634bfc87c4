"""bench/step_breakdown_gpu.py on the CPU (tiny random shape): every case is timed both ways
(whole cache, used keys) and the SDPA backends this device refuses are named, not fatal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def test_the_step_breakdown_runs_every_case(tmp_path: Path) -> None:
    out = tmp_path / "breakdown.json"
    argv = ["--shape", "tiny", "--device", "cpu", "--batches", "1,4", "--repeats", "1"]
    argv += ["--cache-len", "128", "--context", "40", "--out", str(out)]
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "step_breakdown_gpu.py"), *argv],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    report = json.loads(out.read_text())
    assert report["used_keys"] == 64  # context 40 + a block of 16, rounded up to 64
    for batch in (1, 4):
        for name in (f"verify {batch}x1", f"verify {batch}x8", f"verify {batch}x16"):
            case = report["cases"][name]
            assert case["graph_ms"] > 0 and case["graph_ms_used_keys"] > 0
        if batch > 1:  # rows of mixed widths, packed as the ragged graphs run them
            (ragged,) = [name for name in report["cases"] if name.startswith(f"ragged {batch}x16")]
            assert report["cases"][ragged]["graph_ms"] > 0
        attention = report["cases"][f"attention {batch}x16 (one layer)"]
        assert isinstance(attention["MATH keys=128"], float)
        for label, value in attention.items():  # a backend this device refuses is named
            assert isinstance(value, float) or value.startswith("unsupported"), label
    for choice in ("default", "no_cudnn"):  # new attention shapes: first and second call
        first_use = report["first_use"][choice]
        assert len(first_use["first_call_ms"]) == len(first_use["second_call_ms"]) == 6


def test_the_whole_step_cases_run_with_the_triton_attention(tmp_path: Path) -> None:
    """``--attention triton`` (Triton's CPU interpreter here): the start-up check passes and
    every whole-step case, the ragged one reading its packed queries in place, is timed."""
    out = tmp_path / "breakdown.json"
    argv = ["--shape", "tiny", "--device", "cpu", "--batches", "4", "--widths", "1,16"]
    argv += ["--repeats", "1", "--cache-len", "128", "--context", "40", "--attention", "triton"]
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "step_breakdown_gpu.py"), *argv, "--out", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    report = json.loads(out.read_text())
    assert report["attention"] == "triton"
    names = [name for name in report["cases"] if not name.startswith("attention")]
    assert len(names) == 4 and any(name.startswith("ragged 4x16") for name in names), names
    assert all(report["cases"][name]["graph_ms"] > 0 for name in names)
