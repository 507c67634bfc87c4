import json
import re
from pathlib import Path

import numpy as np
import pytest

from controller.classifier.artifact import load_classifier, save_artifact
from controller.classifier.features import (
    WORD_SEGMENT_OFFSET,
    FeatureSpec,
    bucket_indexes,
    request_buckets,
    text_bytes,
    word_buckets,
)
from controller.classifier.model import LinearClassifier
from policies.types import TASKS


def test_one_bucket_per_byte_ngram_and_deterministic() -> None:
    spec = FeatureSpec(ngram_sizes=(1, 3), num_bits=10)
    buckets = bucket_indexes("hello", spec)
    assert buckets.size == 5 + 3
    assert buckets.min() >= 0 and buckets.max() < 1024
    assert np.array_equal(buckets, bucket_indexes("hello", spec))


def test_any_script_and_lone_surrogates_are_hashed() -> None:
    spec = FeatureSpec(ngram_sizes=(2,), num_bits=12)
    assert bucket_indexes("数学题", spec).size == len("数学题".encode()) - 1
    assert bucket_indexes("bad \ud800 text", spec).size > 0


def test_empty_and_short_text() -> None:
    spec = FeatureSpec(ngram_sizes=(4, 5), num_bits=12)
    assert bucket_indexes("", spec).size == 0
    assert bucket_indexes("abc", spec).size == 0
    assert bucket_indexes("abcd", spec).size == 1


def test_lowercase_option_folds_case() -> None:
    spec = FeatureSpec(ngram_sizes=(3,), num_bits=16, is_lowercase=True)
    assert np.array_equal(bucket_indexes("DEF Foo", spec), bucket_indexes("def foo", spec))


def test_context_segment_hashes_apart_and_segment_zero_is_unsegmented() -> None:
    spec = FeatureSpec(ngram_sizes=(1, 3), num_bits=16)
    focus = bucket_indexes("def main(): pass", spec, segment=0)
    context = bucket_indexes("def main(): pass", spec, segment=1)
    assert np.array_equal(focus, bucket_indexes("def main(): pass", spec))
    assert focus.size == context.size and not np.array_equal(focus, context)


def test_request_buckets_one_array_per_segment() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi there"},
            {"role": "user", "content": "continue"},
        ]
    }
    segmented = FeatureSpec(ngram_sizes=(1,), num_bits=12, is_segmented=True)
    focus, context = request_buckets(body, segmented, 4000)
    assert (focus.size, context.size) == (len("continue"), len("hi there\nhello"))
    whole = request_buckets(
        body, FeatureSpec(ngram_sizes=(1,), num_bits=12, is_segmented=False), 4000
    )
    assert len(whole) == 1 and whole[0].size == len("continue\nhi there\nhello")
    assert request_buckets({"prompt": "x"}, segmented, 4000)[1].size == 0


def reference_words(text: str, segment: int, spec: FeatureSpec) -> list[int]:
    """The word view as written in features' docstring, one token at a time."""
    symbols = rb"|[!-/:-@\[-^`{-~]" if spec.word_view == "words+symbols" else b""
    pattern = rb"[A-Za-z0-9_]+" + symbols
    buckets = []
    for match in re.finditer(pattern, text.encode("utf-8", "replace")):
        value = 0
        for byte in match.group().lower():
            value = (value * 16_777_619 + byte) & 0xFFFFFFFF
        salted = (value + (segment + WORD_SEGMENT_OFFSET) * 0x7F4A7C15) & 0xFFFFFFFF
        buckets.append(((salted * 0x85EBCA6B) & 0xFFFFFFFF) >> (32 - spec.num_bits))
    return buckets


@pytest.mark.parametrize("word_view", ["words", "words+symbols"])
def test_word_view_hashes_each_ascii_word_whole(word_view: str) -> None:
    spec = FeatureSpec(word_view=word_view)
    texts = ["как в git отменить, SQL-запрос x^2+3=0?", "Hello_World42 foo", "日本語だけ", "",
             "...", "é", "a" * 5000 + " b", "\ud800 git"]  # fmt: skip
    for text in texts:
        for segment in (0, 1):
            data = text_bytes(text, spec)
            assert word_buckets(data, spec, segment).tolist() == reference_words(
                text, segment, spec
            ), text
    assert word_buckets(text_bytes("abc", FeatureSpec()), FeatureSpec(), 0).size == 0


def test_a_latin_word_in_other_scripts_keeps_its_whole_weight() -> None:
    """The word view is scored with its own 1/sqrt(words): a tool name inside Russian or
    Japanese text weighs as much as alone, however long the text around it (#17)."""
    spec = FeatureSpec(word_view="words")
    git = word_buckets(text_bytes("GIT", spec), spec, 0)[0]
    weights = np.zeros((3, spec.num_buckets), dtype=np.float32)
    weights[1, git] = 4.0
    model = LinearClassifier(spec, TASKS, weights, np.zeros(3, np.float32), scorer="numpy")
    for text in ("git", "как в git отменить последний коммит, но оставить изменения?",
                 "gitで" + "直前のコミットを取り消すには？" * 20):  # fmt: skip
        scores, _ = model.segment_scores(text, 0)
        assert scores[1] == pytest.approx(4.0), text
    plain = LinearClassifier(FeatureSpec(), TASKS, weights, np.zeros(3, np.float32), scorer="numpy")
    assert plain.segment_scores("как в git отменить", 0)[0][1] < 1.0


def test_word_view_round_trips_through_the_artifact(tmp_path: Path) -> None:
    spec = FeatureSpec(word_view="words+symbols")
    weights = np.zeros((3, spec.num_buckets), dtype=np.float32)
    model = LinearClassifier(spec, TASKS, weights, np.zeros(3, np.float32))
    save_artifact(model, tmp_path, {"tasks": [task.value for task in TASKS]})
    assert load_classifier(tmp_path).spec.word_view == "words+symbols"
    save_artifact(
        LinearClassifier(FeatureSpec(), TASKS, weights, np.zeros(3, np.float32)), tmp_path, {}
    )
    assert "word_view" not in json.loads((tmp_path / "manifest.json").read_text())["features"]
