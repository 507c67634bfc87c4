"""bench/decode_gpu.py's per-batch floors (issue #16's plain-decode table): the weights read
once, plus each row's used keys and values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.decode_gpu import batch_floor_ms, fastest_runner, kv_bytes_per_row, resummarise
from engines.embedded.shapes import TARGET_SHAPES


def test_a_rows_kv_is_every_layers_keys_and_values_at_its_context() -> None:
    shape = TARGET_SHAPES["qwen3-8b"]  # 36 layers, 8 KV heads of 128, bf16
    assert kv_bytes_per_row(shape, 512) == 2 * 36 * 8 * 128 * 512 * 2


def test_the_floor_reads_the_weights_once_and_each_rows_kv() -> None:
    weights, kv, bandwidth = 15e9, 75e6, 4e12
    assert batch_floor_ms(weights, kv, 1, bandwidth) == pytest.approx(1e3 * 15.075e9 / 4e12)
    assert batch_floor_ms(weights, kv, 64, bandwidth) == pytest.approx(1e3 * 19.8e9 / 4e12)


def test_the_batch_table_reports_the_fastest_runner_beside_every_runners_own() -> None:
    table = {
        "1": {"floor_ms": 2.0, "step_ms_eager": 4.0, "step_ms_compiled_triton": 3.0},
        "8": {"floor_ms": 2.5, "step_ms_eager": 4.5, "step_ms_compiled_triton": 5.0},
    }
    out = fastest_runner(table)
    assert out["1"]["runner"] == "compiled_triton" and out["1"]["step_ms"] == 3.0
    assert out["1"]["ratio"] == pytest.approx(1.5)
    assert out["8"]["runner"] == "eager" and out["8"]["ratio"] == pytest.approx(1.8)
    assert out["1"]["step_ms_eager"] == 4.0  # every runner's own figure stays


def test_an_older_table_reads_its_step_ms_as_the_eager_reference(tmp_path: Path) -> None:
    source = tmp_path / "old.json"
    old = {"1": {"step_ms": 6.6, "floor_ms": 3.6, "ratio": 1.83, "step_ms_compiled_triton": 5.1}}
    source.write_text(json.dumps({"shapes": {"qwen3-8b": {"batch": old}}}))
    written = json.loads(resummarise(source, tmp_path / "out").read_text())
    row = written["shapes"]["qwen3-8b"]["batch"]["1"]
    assert row["step_ms_eager"] == 6.6 and row["runner"] == "compiled_triton"
    assert row["step_ms"] == 5.1 and row["ratio"] == pytest.approx(5.1 / 3.6)
    assert written["resummarised_from"] == str(source)
    with pytest.raises(ValueError, match="no runner's step_ms"):
        fastest_runner({"1": {"floor_ms": 1.0}})


def test_a_variant_run_is_reported_beside_its_reference() -> None:
    """decode_gpu's engine variants (bursts on and off, the general path): a setting held for
    the block and restored after it, even when the run raises; per-step times kept and the
    tokens compared with the reference run's."""
    from types import SimpleNamespace

    from bench.decode_gpu import _setting, _variant

    engine = SimpleNamespace(plain_burst=4)
    with _setting(engine, "plain_burst", 1):
        assert engine.plain_burst == 1
    assert engine.plain_burst == 4
    with pytest.raises(RuntimeError), _setting(engine, "plain_burst", 2):
        raise RuntimeError("run failed")
    assert engine.plain_burst == 4
    result = {"engine_k0": {"output_ids": [1, 2, 3]}}
    run = {"ms_per_step_wall": 5.0, "ms_per_step_device": 4.9, "num_steps": 3, "output_ids": [1, 2]}
    _variant(result, "engine_k0_single", run, "engine_k0")
    assert result["engine_k0_single"] == {
        "ms_per_step_wall": 5.0,
        "ms_per_step_device": 4.9,
        "num_steps": 3,
        "same_tokens": False,
    }
