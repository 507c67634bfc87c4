import numpy as np

from controller.classifier.features import FeatureSpec, bucket_indexes


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
