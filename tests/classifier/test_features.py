import numpy as np

from controller.classifier.features import FeatureSpec, bucket_indexes, request_buckets


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
