"""bench/decode_gpu.py's per-batch floors (issue #16's plain-decode table): the weights read
once, plus each row's used keys and values."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from bench.decode_gpu import batch_floor_ms, kv_bytes_per_row
from engines.embedded.shapes import TARGET_SHAPES


def test_a_rows_kv_is_every_layers_keys_and_values_at_its_context() -> None:
    shape = TARGET_SHAPES["qwen3-8b"]  # 36 layers, 8 KV heads of 128, bf16
    assert kv_bytes_per_row(shape, 512) == 2 * 36 * 8 * 128 * 512 * 2


def test_the_floor_reads_the_weights_once_and_each_rows_kv() -> None:
    weights, kv, bandwidth = 15e9, 75e6, 4e12
    assert batch_floor_ms(weights, kv, 1, bandwidth) == pytest.approx(1e3 * 15.075e9 / 4e12)
    assert batch_floor_ms(weights, kv, 64, bandwidth) == pytest.approx(1e3 * 19.8e9 / 4e12)
