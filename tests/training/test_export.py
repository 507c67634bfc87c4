"""Exported pairs load where users load them and speculate losslessly; the committed demo pair
is such a pair and fits its size budget."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dflash_model = pytest.importorskip("dflash.model")

from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM  # noqa: E402

from training.chat import render  # noqa: E402
from training.draft import draft_config_dict  # noqa: E402
from training.draft_model import DFlashDraft  # noqa: E402
from training.export import export_draft, export_target, finish_target_dir  # noqa: E402
from training.recipe import DraftConfig, TargetConfig  # noqa: E402
from training.target import target_config  # noqa: E402
from training.tokenizer import build_tokenizer, save_hf_tokenizer  # noqa: E402

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"


def tiny_tokenizer(out_dir: Path) -> None:
    from tokenizers import trainers

    from training.chat import SPECIAL_TOKENS

    tokenizer = build_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(SPECIAL_TOKENS))
    tokenizer.train_from_iterator(
        ["def f(x):\n    return x + 1\n", "What is 2 + 3? It is 5."] * 50, trainer=trainer
    )
    save_hf_tokenizer(tokenizer, out_dir)


def greedy(draft, target, ids, block_size):
    return dflash_model.dflash_generate(draft, target, ids, 24, [2, 0], block_size=block_size)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pair")
    tiny_tokenizer(root / "tok")
    torch.manual_seed(0)
    cfg = TargetConfig(
        hidden_size=32,
        num_layers=6,
        intermediate_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        max_position_embeddings=256,
    )
    target = Qwen3ForCausalLM(target_config(cfg, 300))
    export_target(target, root / "target")
    finish_target_dir(root / "target", root / "tok")
    config = draft_config_dict(target.config, DraftConfig(num_layers=2), 8)
    draft = DFlashDraft(type(target.config)(**config), config["dflash_config"]["target_layer_ids"])
    export_draft(draft, config, root / "draft")
    return root


def test_draft_dir_is_a_dflash_dir_without_embeddings(exported: Path):
    config = json.loads((exported / "draft" / "config.json").read_text())
    assert config["dflash_config"] == {
        "block_size": 8,
        "target_layer_ids": [1, 3],
        "mask_token_id": 3,
    }
    assert config["num_target_layers"] == 6
    with safe_open(str(exported / "draft" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in keys)
    assert "fc.weight" in keys and not any("embed" in k or "lm_head" in k for k in keys)


def test_exported_pair_speculates_losslessly(exported: Path):
    target = AutoModelForCausalLM.from_pretrained(exported / "target", dtype=torch.float32).eval()
    draft = dflash_model.DFlashDraftModel.from_pretrained(exported / "draft", dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(exported / "target")
    ids = torch.tensor(
        [tokenizer.encode(render([{"role": "user", "content": "What is 2 + 3?"}], True))]
    )
    assert torch.equal(greedy(draft.eval(), target, ids, 8), greedy(draft, target, ids, 1))


def test_chat_template_matches_the_corpus_format(exported: Path):
    tokenizer = AutoTokenizer.from_pretrained(exported / "target")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == render(messages)
    assert tokenizer.apply_chat_template(
        messages[:1], tokenize=False, add_generation_prompt=True
    ) == (render(messages[:1], add_generation_prompt=True))


def test_demo_pair_fits_its_budget_and_loads():
    total = sum(p.stat().st_size for p in DEMO.rglob("*") if p.is_file())
    assert total <= 25_000_000, f"demo pair is {total} bytes"
    draft = dflash_model.DFlashDraftModel.from_pretrained(DEMO / "draft", dtype=torch.float32)
    target = AutoModelForCausalLM.from_pretrained(DEMO / "target", dtype=torch.float32).eval()
    assert draft.target_layer_ids and max(draft.target_layer_ids) < target.config.num_hidden_layers
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "target")
    assert tokenizer.convert_tokens_to_ids("<|mask|>") == draft.mask_token_id
    text = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    ids = torch.tensor([tokenizer.encode(render([{"role": "user", "content": text}], True))])
    assert torch.equal(
        greedy(draft.eval(), target, ids, draft.block_size), greedy(draft, target, ids, 1)
    )
