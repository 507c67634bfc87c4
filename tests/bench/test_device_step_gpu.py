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


def test_split_widths_and_top1_add_their_variants_and_checks(tmp_path: Path) -> None:
    """``--split-widths``: the parts of a two-phase step's extra cost (the whole-block draft,
    the verify at the block's width, the allocation at narrow widths); ``--top1``: every
    variant again on PyTorch's reductions, and the fused argmax / probability checked against
    them (identical argmax, the probability nearer a float64 softmax)."""
    out = tmp_path / "device_step.json"
    argv = ["--device", "cpu", "--tiny", "--rows", "4:5", "--steps", "1", "--context-len", "48"]
    assert main([*argv, "--also-k", "", "--split-widths", "--top1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    base = {"one_phase_k5", "one_phase_k15", "two_phase_device", "two_phase_host"}
    base |= {"one_phase_k5_whole_draft", "one_phase_mixed_widths", "two_phase_device_cap5"}
    variants = base | {f"{name}_torch_top1" for name in base}
    assert set(result["batches"]["4"]["wall_ms_median"]) == variants
    for entry in result["top1"].values():
        assert entry["argmax_identical"] and entry["argmax_prob_identical"]
        assert entry["prob_max_abs_err"]["fused"] <= entry["prob_max_abs_err"]["torch"] + 1e-6


def test_mixed_widths_keep_the_total_and_reach_the_block() -> None:
    from bench.device_step_gpu import K, mixed_widths

    for rows, k in ((64, 7), (8, 8), (64, 5), (16, 4)):
        widths = mixed_widths(rows, k)
        assert len(widths) == rows and sum(widths) == rows * k and max(widths) == K
    assert mixed_widths(1, 15) == [15] and mixed_widths(2, 7) == [7, 7]
