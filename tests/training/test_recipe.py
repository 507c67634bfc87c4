"""Recipe files: the committed ones load; unknown keys and wrong types name the dotted key."""

from pathlib import Path

import pytest

from training.recipe import RecipeError, load_recipe, scale_time

CONFIGS = Path(__file__).resolve().parents[2] / "training" / "configs"


@pytest.mark.parametrize("name", ["demo", "testbed"])
def test_committed_recipes_load(name: str):
    recipe = load_recipe(CONFIGS / f"{name}.yaml")
    assert recipe.name == name
    assert recipe.target.num_heads % recipe.target.num_kv_heads == 0
    assert all(b in (8, 16) for b in recipe.draft.block_sizes)


def test_testbed_target_is_at_least_1024_wide():
    assert load_recipe(CONFIGS / "testbed.yaml").target.hidden_size >= 1024


def test_unknown_nested_key_is_named(tmp_path: Path):
    path = tmp_path / "r.yaml"
    path.write_text("draft:\n  train:\n    batchsize: 3\n")
    with pytest.raises(RecipeError, match=r"draft\.train\.batchsize: unknown key"):
        load_recipe(path)


def test_wrong_type_is_named(tmp_path: Path):
    path = tmp_path / "r.yaml"
    path.write_text("target:\n  hidden_size: wide\n")
    with pytest.raises(RecipeError, match=r"target\.hidden_size: expected int, got 'wide'"):
        load_recipe(path)


def test_scale_time_scales_every_budget():
    recipe = load_recipe(CONFIGS / "demo.yaml")
    half = scale_time(recipe, 0.5)
    assert half.target_train.time_budget_s == recipe.target_train.time_budget_s / 2
    assert half.generation.time_budget_s == recipe.generation.time_budget_s / 2
    assert half.draft.train.time_budget_s == recipe.draft.train.time_budget_s / 2
    assert half.target == recipe.target
