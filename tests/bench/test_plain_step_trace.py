"""bench/plain_step_trace.py's CPU smoke: a tiny engine's plain steps timed and traced, the
host operators summarised per step (the GPU run says where a plain step's time goes outside
its graph)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.plain_step_trace import main


def test_the_smoke_run_summarises_the_host_operators_per_step(tmp_path: Path) -> None:
    out, trace = tmp_path / "t.json", tmp_path / "t.json.gz"
    args = ["--tiny", "--device", "cpu", "--steps", "3", "--warmup", "2", "--top", "5"]
    assert main([*args, "--out", str(out), "--trace", str(trace)]) == 0
    report = json.loads(out.read_text())
    assert report["batch"] == 1 and report["steps"] == 3 and report["shape"] == "tiny"
    assert report["runner"]["cuda_graphs"] is True
    assert len(report["host_ops"]) == 5
    assert all(op["calls_per_step"] > 0 for op in report["host_ops"])
    ordered = [op["self_cpu_us_per_step"] for op in report["host_ops"]]
    assert ordered == sorted(ordered, reverse=True)
    assert 0 < report["wall_ms"]["min"] <= report["wall_ms"]["median"] <= report["wall_ms"]["max"]
    assert report["device_idle_ms"] is None  # no device activity on the CPU
    assert "traceEvents" in json.loads(gzip.decompress(trace.read_bytes()))


def test_the_full_shape_is_refused_on_the_cpu(tmp_path: Path) -> None:
    assert main(["--device", "cpu", "--out", str(tmp_path / "t.json")]) == 2
    with pytest.raises(SystemExit):
        main(["--tiny", "--device", "cpu", "--steps", "0", "--out", str(tmp_path / "t.json")])
