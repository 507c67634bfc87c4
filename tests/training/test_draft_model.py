"""The training-form draft computes exactly what dflash's reference draft computes."""

import pytest

torch = pytest.importorskip("torch")
dflash_model = pytest.importorskip("dflash.model")

from transformers import Qwen3Config  # noqa: E402

from training.draft import MASK_ID, build_target_layer_ids, draft_config_dict  # noqa: E402
from training.draft_model import DFlashDraft, block_mask, block_positions  # noqa: E402
from training.recipe import DraftConfig  # noqa: E402


def tiny_target_config() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )


def pair(block_size: int = 8):
    torch.manual_seed(0)
    config = draft_config_dict(tiny_target_config(), DraftConfig(num_layers=2), block_size)
    ours = DFlashDraft(Qwen3Config(**config), config["dflash_config"]["target_layer_ids"]).eval()
    for p in ours.parameters():  # norms start at 1: randomise them too
        torch.nn.init.normal_(p, std=0.3)
    reference = dflash_model.DFlashDraftModel(Qwen3Config(**config)).eval()
    missing, unexpected = reference.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    return ours, reference, config


def test_layer_ids_follow_dflash_spacing():
    for layers, draft_layers in [(8, 3), (12, 5), (36, 5), (8, 1)]:
        assert build_target_layer_ids(layers, draft_layers) == dflash_model.build_target_layer_ids(
            layers, draft_layers
        )


def test_one_block_matches_reference():
    ours, reference, config = pair(8)
    ctx_len, block, hidden = 11, 8, 32
    features = torch.randn(1, ctx_len, len(config["dflash_config"]["target_layer_ids"]) * hidden)
    noise = torch.randn(1, block, hidden)
    positions = torch.arange(ctx_len + block)[None]
    expected = reference(position_ids=positions, noise_embedding=noise, target_hidden=features)
    anchors = torch.tensor([[ctx_len]])
    got = ours(
        noise,
        features,
        block_positions(anchors, block),
        positions[:, :ctx_len],
        block_mask(anchors, ctx_len, block),
    )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_packed_blocks_match_one_block_at_a_time():
    ours, reference, config = pair(4)
    seq_len, block, hidden = 20, 4, 32
    features = torch.randn(2, seq_len, len(config["dflash_config"]["target_layer_ids"]) * hidden)
    anchors = torch.tensor([[3, 9, 14], [1, 5, 16]])
    noise = torch.randn(2, 3 * block, hidden)
    context_pos = torch.arange(seq_len).expand(2, -1)
    packed = ours(
        noise,
        features,
        block_positions(anchors, block),
        context_pos,
        block_mask(anchors, seq_len, block),
    )
    for row in range(2):
        for j, anchor in enumerate(anchors[row].tolist()):
            slots = slice(j * block, (j + 1) * block)
            expected = reference(
                position_ids=torch.arange(anchor + block)[None],
                noise_embedding=noise[row : row + 1, slots],
                target_hidden=features[row : row + 1, :anchor],
            )
            torch.testing.assert_close(packed[row : row + 1, slots], expected, rtol=1e-5, atol=1e-5)


def test_mask_token_is_the_dflash_mask_id():
    config = draft_config_dict(tiny_target_config(), DraftConfig(num_layers=2), 16)
    assert config["dflash_config"] == {
        "block_size": 16,
        "target_layer_ids": [1, 3],
        "mask_token_id": MASK_ID,
    }
    assert config["architectures"] == ["DFlashDraftModel"]
