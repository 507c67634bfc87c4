"""bench/gemv_gpu.py's smoke mode: every decode matrix of a tiny shape through the few-token
kernel (Triton's interpreter), its difference from F.linear recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.decode_gpu import runner_label
from bench.gemv_gpu import main, matrices
from engines.embedded.shapes import TARGET_SHAPES


def test_the_smoke_run_writes_every_matrix_within_float_error(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    assert main(["--smoke", "--rows", "1,3", "--out", str(out)]) == 0
    cells = json.loads(out.read_text())["shapes"]["tiny"]
    assert sorted({key.split("/")[0] for key in cells}) == sorted(
        ["qkv", "o_proj", "gate_up", "down", "lm_head", "draft_fc"]
    )
    assert {cell["rows"] for cell in cells.values()} == {1, 3}
    assert all(
        cell["max_abs_diff"] < 1e-4 * cell["reference_abs_max"] + 1e-5 for cell in cells.values()
    )
    parts = {key.split("/")[0]: cell.get("part") for key, cell in cells.items()}
    assert parts == {
        "qkv": "norm",
        "o_proj": "residual",
        "gate_up": "norm",
        "down": "act",
        "lm_head": None,
        "draft_fc": None,
    }
    assert all(cell.get("fused_max_abs_diff", 0.0) < 1e-4 for cell in cells.values())


def test_the_8b_matrices_are_its_projections() -> None:
    shape = TARGET_SHAPES["qwen3-8b"]
    named = matrices(shape, 5)
    assert named["qkv"] == ((32 + 2 * 8) * 128, 4096)
    assert named["gate_up"] == (2 * 12288, 4096) and named["down"] == (4096, 12288)
    assert named["draft_fc"] == (4096, 5 * 4096) and named["lm_head"][1] == 4096


def test_rows_outside_one_tile_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--smoke", "--rows", "17", "--out", str(tmp_path / "g.json")])


def test_decode_gpu_labels_the_gemv_runners() -> None:
    assert runner_label(True, "triton", "default", "gemv") == "compiled_triton_gemv"
    assert runner_label(False, "sdpa", linear="gemv") == "eager_gemv"
    assert runner_label(True, "triton", "max-autotune") == "compiled_triton_max_autotune"


def test_decode_gpu_labels_the_deferring_runners() -> None:
    assert runner_label(True, "triton", "default", "gemv", True) == "compiled_triton_gemv_defer"
    assert runner_label(False, "sdpa", defer=True) == "eager_defer"
