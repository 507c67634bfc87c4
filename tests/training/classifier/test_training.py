"""Training on a tiny corpus, and the artifact round trip (no pickle)."""

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from controller.classifier.artifact import ArtifactError, load_classifier, save_artifact
from controller.classifier.features import FeatureSpec
from policies.types import Task
from tests.training.classifier.guesses import one_hot_guesses
from training.classifier.corpus import Example, user
from training.classifier.dataset import build_dataset
from training.classifier.training import TrainSettings, fit

MATH = ["Solve 3x + 5 = 20 for x.", "What is 17 * 23?", "Compute the integral of x^2 dx."]
CODE = [
    "Write a Python function to reverse a list.",
    "def fib(n):\n    ",
    "Fix: for i in range(10) print(i)",
]
CHAT = ["Tell me a story about a cat.", "How are you today?", "Write a poem about the sea."]


def tiny_dataset():  # type: ignore[no-untyped-def]
    examples = [
        Example(user(text), task, "tiny", f"{task}-{i}")
        for task, texts in ((Task.MATH, MATH), (Task.CODE, CODE), (Task.CHAT, CHAT))
        for i, text in enumerate(texts)
    ]
    return build_dataset(examples, held_out_percent=0)


def test_fit_learns_a_tiny_corpus_and_survives_the_round_trip(tmp_path: Path) -> None:
    settings = TrainSettings(spec=FeatureSpec(num_bits=12), alpha=1e-4, num_epochs=50, num_hidden=0)
    model = fit(tiny_dataset(), settings)
    for task, texts in ((Task.MATH, MATH), (Task.CODE, CODE), (Task.CHAT, CHAT)):
        assert [model.classify(user(t)).task for t in texts] == [task] * 3
    save_artifact(model, tmp_path, {"note": "test"})
    loaded = load_classifier(tmp_path)
    for text in MATH + CODE + CHAT:
        before, after = model.classify(user(text)), loaded.classify(user(text))
        assert before.task == after.task
        assert np.isclose(before.confidence, after.confidence, atol=1e-3)  # float16 weights


def test_same_seed_gives_the_same_weights() -> None:
    settings = TrainSettings(spec=FeatureSpec(num_bits=10), num_epochs=5)
    first, second = fit(tiny_dataset(), settings), fit(tiny_dataset(), settings)
    assert np.array_equal(first.weights, second.weights)


def test_duplicates_are_dropped_and_counted() -> None:
    examples = [Example(user("same"), Task.CHAT, "s", group) for group in ("g1", "g2")]
    dataset = build_dataset(examples)
    assert len(dataset.texts) == 1 and dataset.num_duplicates == 1


def test_missing_or_mismatched_artifact_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=re.escape(str(tmp_path))):
        load_classifier(tmp_path)
    model = fit(tiny_dataset(), TrainSettings(spec=FeatureSpec(num_bits=8), num_epochs=2))
    save_artifact(model, tmp_path, {})
    manifest = tmp_path / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"num_bits": 8', '"num_bits": 9'))
    with pytest.raises(ArtifactError, match=r"weights\.npz"):
        load_classifier(tmp_path)


def test_segmented_flag_round_trips_and_old_manifests_load_unsegmented(tmp_path: Path) -> None:
    settings = TrainSettings(spec=FeatureSpec(num_bits=8), num_epochs=2, num_hidden=0)
    model = fit(tiny_dataset(), settings)
    assert model.spec.is_segmented and model.combiner is None
    save_artifact(model, tmp_path, {})
    assert load_classifier(tmp_path).spec.is_segmented
    manifest = tmp_path / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"is_segmented": true,', ""))
    assert not load_classifier(tmp_path).spec.is_segmented


def test_combiner_is_fitted_saved_and_loaded_with_the_same_scores(tmp_path: Path) -> None:
    settings = TrainSettings(spec=FeatureSpec(num_bits=10), num_epochs=5, num_hidden=4, num_folds=2)
    model = fit(tiny_dataset(), settings)
    assert model.combiner is not None and model.combiner.w1.shape == (4, 8)
    save_artifact(model, tmp_path, {})
    loaded = load_classifier(tmp_path)
    assert loaded.combiner is not None
    body = {
        "messages": [
            {"role": "user", "content": "Write a poem about the sea."},
            {"role": "assistant", "content": "The sea is wide."},
            {"role": "user", "content": "Solve 3x + 5 = 20 for x."},
        ]
    }
    before, after = model.classify(body).scores, loaded.classify(body).scores
    assert all(np.isclose(before[t], after[t], atol=1e-2) for t in before)  # float16 weights
    # A combiner reads segment scores: an unsegmented manifest cannot carry one.
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        manifest.read_text().replace('"is_segmented": true', '"is_segmented": false')
    )
    with pytest.raises(ArtifactError, match="segmented"):
        load_classifier(tmp_path)


def test_class_weights_by_task_name() -> None:
    from training.classifier.training import class_weights

    assert class_weights("code=2") == {0: 1.0, 1: 2.0, 2: 1.0}  # TASKS: math, code, chat
    assert class_weights("balanced") == "balanced" and class_weights(None) is None
    with pytest.raises(ValueError, match=r"'prose=2'.*math, code, chat"):
        class_weights("prose=2")


def test_source_weights_parse_match_by_prefix_and_name_a_bad_item() -> None:
    from training.classifier.training import parse_source_weights, sample_weights

    weights = parse_source_weights("synthetic=0.5, math500=3")
    assert weights == (("synthetic", 0.5), ("math500", 3.0))
    assert parse_source_weights(None) == () and sample_weights(["a"], ()) is None
    got = sample_weights(["synthetic_paste", "math500", "sharegpt_first"], weights)
    assert got is not None and got.tolist() == [0.5, 3.0, 1.0]
    # Keys are source/label (weight_key), so a prefix may name one label of a source.
    by_label = parse_source_weights("sharegpt_first/math=3,sharegpt=0.5")
    keys = ["sharegpt_first/math", "sharegpt_first/chat", "sharegpt_later/math", "gsm8k/math"]
    got = sample_weights(keys, by_label)
    assert got is not None and got.tolist() == [3.0, 0.5, 0.5, 1.0]
    for bad in ("synthetic", "synthetic=0", "=2", "synthetic=lots"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            parse_source_weights(bad)


def conflicting_dataset():  # type: ignore[no-untyped-def]
    """The same kind of request labelled math by source "a" and chat by source "b" (and some
    code, so that every task has examples)."""
    examples = [
        Example(user(f"Tell me about the number {i} please"), task, source, f"{source}-{i}")
        for source, task, numbers in (
            ("a", Task.MATH, range(0, 40)),
            ("b", Task.CHAT, range(40, 80)),
        )
        for i in numbers
    ]
    examples += [Example(user(text), Task.CODE, "c", text) for text in CODE]
    return build_dataset(examples, held_out_percent=0)


def test_source_weights_decide_between_conflicting_sources() -> None:
    base = TrainSettings(spec=FeatureSpec(num_bits=10), alpha=1e-4, num_epochs=20, num_hidden=0)
    request = user("Tell me about the number 123 please")
    for setting, task in (("a=20", Task.MATH), ("b=20", Task.CHAT)):
        model = fit(conflicting_dataset(), replace(base, source_weights=setting))
        assert model.classify(request).task == task, setting


def test_combiner_follows_its_sample_weights() -> None:
    from training.classifier.stacking import combiner_logits, fit_combiner

    rng = np.random.default_rng(0)
    features = np.repeat(rng.normal(size=(3, 8)), 30, axis=0)  # 3 distinct inputs
    labels = np.repeat(np.array([0, 1, 2]), 30)
    labels[:15] = 2  # the first input: half math, half chat
    for math_weight, expected in ((20.0, 0), (0.05, 2)):
        weights = np.where(labels == 0, math_weight, 1.0)
        combiner = fit_combiner(features, labels, num_hidden=4, seed=0, weights=weights)
        assert int(np.argmax(combiner_logits(combiner, features[:1]))) == expected


def test_train_command_reads_source_weights_and_rejects_a_bad_one(tmp_path: Path) -> None:
    from controller.cli import build_parser
    from controller.commands.classifier import settings_from
    from training.classifier.training import SOURCE_WEIGHTS

    def settings(*extra: str):  # type: ignore[no-untyped-def]
        argv = ["classifier", "train", "--out", str(tmp_path), *extra]
        return settings_from(build_parser().parse_args(argv))

    assert settings().source_weights == SOURCE_WEIGHTS
    assert settings("--source-weights", "none").source_weights is None
    assert settings("--source-weights", "pygments=2").source_weights == "pygments=2"
    with pytest.raises(ValueError, match="'pygments=-1'"):
        settings("--source-weights", "pygments=-1")


def test_temperature_scale_multiplies_the_fitted_temperature() -> None:
    from training.classifier.stacking import calibrated_combiner, combiner_logits

    features, labels = one_hot_guesses(300, 0.8)
    fitted, temperature = calibrated_combiner(features, labels, num_hidden=4, seed=0)
    scaled, scaled_temperature = calibrated_combiner(
        features, labels, num_hidden=4, seed=0, temperature_scale=0.5
    )
    assert scaled_temperature == pytest.approx(temperature * 0.5)
    # the same MLP, its logits divided by half the temperature: twice as large
    assert combiner_logits(scaled, features) == pytest.approx(2 * combiner_logits(fitted, features))
    with pytest.raises(ValueError, match="must be > 0"):
        calibrated_combiner(features, labels, num_hidden=4, seed=0, temperature_scale=0.0)


def test_train_command_reads_the_temperature_scale(tmp_path: Path) -> None:
    from controller.cli import build_parser
    from controller.commands.classifier import settings_from
    from training.classifier.training import TEMPERATURE_SCALE

    def settings(*extra: str):  # type: ignore[no-untyped-def]
        argv = ["classifier", "train", "--out", str(tmp_path), *extra]
        return settings_from(build_parser().parse_args(argv))

    assert settings().temperature_scale == TEMPERATURE_SCALE == 0.933
    assert settings("--temperature-scale", "1").temperature_scale == 1.0
    with pytest.raises(ValueError, match="must be > 0"):
        settings("--temperature-scale", "0")


def test_word_view_rows_weigh_the_words_apart_and_train_reads_the_flag(tmp_path: Path) -> None:
    """A segment's row is its byte n-grams / sqrt(N) plus its words / sqrt(words), so a tool
    name in Russian text is worth 1.0 in the row (#17, fifth follow-up); the combiner's size
    input is still N."""
    from controller.classifier.features import text_bytes, word_buckets
    from controller.cli import build_parser
    from controller.commands.classifier import settings_from
    from training.classifier.training import segment_matrices

    spec = FeatureSpec(word_view="words")
    text = "как в git отменить последний коммит"
    (focus, _), (sizes, _) = segment_matrices([user(text)], spec)
    plain, (plain_sizes, _) = segment_matrices([user(text)], FeatureSpec())
    git = word_buckets(text_bytes("git", spec), spec, 0)[0]
    assert focus[0, git] == pytest.approx(1.0 + plain[0][0, git], abs=1e-6)
    assert sizes[0] == plain_sizes[0] == len(text.encode()) * 3 - 6
    words_spec = FeatureSpec(num_bits=12, word_view="words")
    settings_ = TrainSettings(spec=words_spec, alpha=1e-4, num_epochs=50, num_hidden=0)
    model = fit(tiny_dataset(), settings_)
    for task, texts in ((Task.MATH, MATH), (Task.CODE, CODE), (Task.CHAT, CHAT)):
        assert [model.classify(user(t)).task for t in texts] == [task] * 3

    def settings(*extra: str):  # type: ignore[no-untyped-def]
        argv = ["classifier", "train", "--out", str(tmp_path), *extra]
        return settings_from(build_parser().parse_args(argv))

    assert settings("--word-view", "none").spec.word_view == ""
    assert settings("--word-view", "words+symbols").spec.word_view == "words+symbols"
