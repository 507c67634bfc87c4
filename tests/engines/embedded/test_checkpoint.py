"""Checkpoint loading errors name the file and the bad value."""

from __future__ import annotations

import json

import pytest

from engines.embedded.checkpoint import CheckpointError, draft_spec, target_shape
from tests.tinymodels import write_tiny_pair


def edit_config(directory, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_reads_the_published_dflash_format(tmp_path) -> None:
    target_dir, draft_dir = write_tiny_pair(tmp_path, block_size=4)
    spec = draft_spec(draft_dir, target_shape(target_dir))
    assert (spec.block_size, spec.target_layer_ids, spec.mask_token_id) == (4, (1, 3), 259)


def test_missing_directory(tmp_path) -> None:
    with pytest.raises(CheckpointError, match=r"config\.json: not found"):
        target_shape(tmp_path / "nope")


def test_unsupported_target_architecture(tmp_path) -> None:
    target_dir, _ = write_tiny_pair(tmp_path)
    edit_config(target_dir, architectures=["MistralForCausalLM"])
    with pytest.raises(CheckpointError, match="MistralForCausalLM"):
        target_shape(target_dir)


def test_draft_layers_beyond_the_target(tmp_path) -> None:
    target_dir, draft_dir = write_tiny_pair(tmp_path)
    edit_config(
        draft_dir, dflash_config={"block_size": 8, "target_layer_ids": [1, 9], "mask_token_id": 259}
    )
    with pytest.raises(CheckpointError, match=r"target_layer_ids=\[1, 9\]"):
        draft_spec(draft_dir, target_shape(target_dir))


def test_dflash2_is_reported_unsupported(tmp_path) -> None:
    target_dir, draft_dir = write_tiny_pair(tmp_path)
    edit_config(draft_dir, architectures=["DFlash2DraftModel"])
    with pytest.raises(CheckpointError, match="DFlash2DraftModel is not supported"):
        draft_spec(draft_dir, target_shape(target_dir))


def test_rope_scaling_is_rejected(tmp_path) -> None:
    target_dir, _ = write_tiny_pair(tmp_path)
    edit_config(target_dir, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4})
    with pytest.raises(CheckpointError, match="rope type 'yarn'"):
        target_shape(target_dir)
