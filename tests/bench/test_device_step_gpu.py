"""bench/device_step_gpu.py on the CPU (tiny random shape): it runs end to end and its JSON
holds, per batch, the one-phase and two-phase steps' times and what the device step verified."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.device_step_gpu import main


def test_smoke_run_on_cpu_writes_the_json(tmp_path: Path) -> None:
    out = tmp_path / "device_step.json"
    argv = ["--device", "cpu", "--tiny", "--rows", "4:5", "--steps", "1", "--context-len", "48"]
    assert main([*argv, "--out", str(out)]) == 0
    batch = json.loads(out.read_text())["batches"]["4"]
    variants = {"one_phase_k5", "one_phase_k7", "one_phase_k15", "two_phase_device"}
    variants |= {"two_phase_host"}  # (--also-k 7 by default: the verify's cost per token)
    assert set(batch["wall_ms_median"]) == set(batch["profiled"]) == variants
    assert all(ms > 0 for ms in batch["wall_ms_median"].values())
    assert all(len(rounds) == 3 for rounds in batch["wall_ms_rounds"].values())  # the spread
    # the device filled at least the budget's slots (a token bucket may pay for more)
    assert 4 + batch["budget"] <= batch["device_verified_tokens"] <= 4 * 16
    assert batch["budget"] == 20 and batch["allocation_graph_only"]["wall_ms"] > 0
