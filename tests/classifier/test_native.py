"""The native scorer (controller/classifier/_ngram.c) against the numpy one it replaces."""

import os
import random
import re
from itertools import islice
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from controller.classifier import features, load_classifier, model
from controller.classifier.combiner import Combiner
from controller.classifier.features import SHAPE_TABLE, FeatureSpec, byte_buckets
from controller.classifier.model import HAS_NATIVE, NATIVE_ENV, LinearClassifier
from controller.classifier.text import chat_pieces, request_segments
from policies.types import TASKS
from training.classifier.corpus import gsm8k, math500, mbpp, mt_bench
from training.classifier.evaluation import evaluate, format_report

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_native = pytest.mark.skipif(
    not HAS_NATIVE,
    reason="controller.classifier._ngram is not built (installed without a C compiler?); "
    "the numpy scorer is in use",
)

CODE = "def area(radius: float) -> float:\n    return 3.14159 * radius ** 2  # π r²\n\n"
PROSE = "The sea was calm that morning, and the gulls circled low over the harbour. "
CJK = "请帮我写一封感谢信给我的老师，感谢她这一年的帮助。日本語のテキストも少し。"
EMOJI = "🌊🐚 sea 🐟🐠🦈 "


def varied_texts() -> list[str]:
    """A few hundred texts: empty, 1-4 bytes, scripts, emoji, lone surrogates, 4,000 chars."""
    texts = ["", "a", "ab", "abc", "abcd", "é", "日", "😀", "\ud800", "x\udfffy", " \n"]
    texts += [CODE * 60, PROSE * 60, (CJK * 100)[:4000], (EMOJI * 400)[:4000]]
    rng = random.Random(0)
    alphabet = [CODE, PROSE, CJK, EMOJI, "\ud83d lone \udc00 surrogates", "0123456789+-*/=^"]
    while len(texts) < 300:
        length = rng.choice([1, 2, 3, 4, 5, 6, 17, 100, 1000, 4000])
        source = "".join(rng.choice(alphabet) for _ in range(length // 10 + 2))
        start = rng.randrange(len(source))
        texts.append((source * (length // len(source) + 2))[start : start + length])
    return texts


TEXTS = varied_texts()


@pytest.fixture(scope="module")
def builtin() -> LinearClassifier:
    return load_classifier(None)


def exact_sums(
    classifier: LinearClassifier, text: str, segment: int
) -> tuple[npt.NDArray[np.float64], int]:
    """The float64 sum of the weight columns of features.byte_buckets' buckets."""
    data = np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8)
    buckets = byte_buckets(data, classifier.spec, segment, classifier.spec.ngram_sizes)
    return classifier.weights[:, buckets].astype(np.float64).sum(axis=1), buckets.size


def test_require_native_when_asked() -> None:
    """`make test` sets DRAFTCTL_REQUIRE_NATIVE=1: the install must have built the extension."""
    if os.environ.get("DRAFTCTL_REQUIRE_NATIVE") != "1":
        pytest.skip("DRAFTCTL_REQUIRE_NATIVE is not 1")
    assert HAS_NATIVE, "controller.classifier._ngram did not build; run `pip install -e .`"


@needs_native
def test_hash_constants_equal_the_numpy_features() -> None:
    from controller.classifier import _ngram

    assert _ngram.PRIME == int(features.PRIME)
    assert _ngram.SALT == features.SALT
    assert _ngram.MULTIPLIER == int(features.MULTIPLIER)
    assert _ngram.SEGMENT_SALT == features.SEGMENT_SALT


@needs_native
@pytest.mark.parametrize("segment", [0, 1])
def test_segment_sums_equal_the_numpy_hash_and_gather(
    builtin: LinearClassifier, segment: int
) -> None:
    from controller.classifier._ngram import segment_sums

    spec = builtin.spec
    for text in TEXTS:
        data = text.encode("utf-8", "replace")
        sums, num_ngrams = segment_sums(
            data, builtin.weights, spec.num_bits, spec.ngram_sizes, segment
        )
        expected, num_expected = exact_sums(builtin, text, segment)
        assert num_ngrams == num_expected, text
        np.testing.assert_allclose(sums, expected, rtol=1e-9, atol=1e-9, err_msg=repr(text[:40]))


@needs_native
@pytest.mark.parametrize("num_tasks", [1, 2, 5, 17])
def test_segment_sums_of_other_task_counts_equal_the_numpy_hash_and_gather(num_tasks: int) -> None:
    """3 tasks take a register-lane path; other counts the generic one (over 16: heap sums)."""
    from controller.classifier._ngram import segment_sums

    spec = FeatureSpec(ngram_sizes=(1, 2, 6), num_bits=12)
    weights = np.random.default_rng(num_tasks).normal(size=(num_tasks, 1 << 12))
    weights = weights.astype(np.float32)
    for text in TEXTS[::5]:
        data = np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8)
        buckets = byte_buckets(data, spec, 1, spec.ngram_sizes)
        sums, num_ngrams = segment_sums(data.tobytes(), weights, 12, (6, 2, 1, 2), 1)
        assert num_ngrams == buckets.size
        expected = weights[:, buckets].astype(np.float64).sum(axis=1)
        np.testing.assert_allclose(sums, expected, rtol=1e-9, atol=1e-9)


@needs_native
@pytest.mark.parametrize("segment", [0, 1])
def test_native_segment_scores_equal_the_numpy_scorer(
    builtin: LinearClassifier, segment: int
) -> None:
    for text in TEXTS:
        native, num_native = builtin.native_segment_scores(text, segment)
        numpy_scores, num_numpy = builtin.segment_scores(text, segment)
        assert num_native == num_numpy, text
        # numpy sums in float32; 1e-6 absolute covers its rounding on near-zero sums.
        np.testing.assert_allclose(native, numpy_scores, rtol=1e-4, atol=1e-6)


def corpus_bodies() -> list[dict[str, Any]]:
    """Requests of the tests' corpora (the first 100 of each) and multi-turn requests."""
    bodies: list[dict[str, Any]] = []
    if SHARED_DATA.is_dir():
        for loader in (gsm8k, mbpp, math500, mt_bench):
            bodies += [example.body for example in islice(loader(SHARED_DATA), 100)]
    bodies += [{"messages": [{"role": "user", "content": text}]} for text in TEXTS]
    bodies += [
        {
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": first},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": last},
            ]
        }
        for first, answer, last in zip(TEXTS[::3], TEXTS[1::3], TEXTS[2::3], strict=False)
    ]
    bodies += [{"prompt": text} for text in TEXTS[:50]] + [{"prompt": [1, 2]}, {}]
    return bodies


@needs_native
def test_builtin_artifact_gives_the_same_guesses_with_both_scorers(
    builtin: LinearClassifier,
) -> None:
    native, numpy_classifier = (
        LinearClassifier(
            builtin.spec, builtin.tasks, builtin.weights, builtin.bias.astype(np.float32),
            builtin.max_chars, builtin.combiner, scorer=scorer,
        )
        for scorer in ("native", "numpy")
    )  # fmt: skip
    bodies = corpus_bodies()
    assert len(bodies) >= 400
    for body in bodies:
        fast, slow = native.classify(body), numpy_classifier.classify(body)
        assert fast.task == slow.task, body
        assert fast.confidence == pytest.approx(slow.confidence, abs=1e-5)
        for task in TASKS:
            assert fast.scores[task] == pytest.approx(slow.scores[task], abs=1e-5)


@needs_native
def test_unsegmented_lowercase_model_without_combiner_scores_the_same() -> None:
    """Other n-gram sizes (one longer than most texts), lowercasing, the sigmoid path."""
    spec = FeatureSpec(
        ngram_sizes=(2, 4, 9), num_bits=10, is_lowercase=True, is_segmented=False, shape_sizes=(3,)
    )
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(3, spec.num_buckets)).astype(np.float32)
    bias = rng.normal(size=3).astype(np.float32)
    native = LinearClassifier(spec, TASKS, weights, bias, scorer="native")
    slow = LinearClassifier(spec, TASKS, weights, bias, scorer="numpy")
    for text in TEXTS:
        fast_guess, slow_guess = native.classify_text(text), slow.classify_text(text)
        assert fast_guess.task == slow_guess.task, text
        assert fast_guess.confidence == pytest.approx(slow_guess.confidence, abs=1e-5)


@needs_native
@pytest.mark.parametrize(
    ("shape_sizes", "word_view", "is_lowercase"),
    [
        ((), "", True),
        ((3, 6), "", True),
        ((1, 2), "", True),
        ((), "words", False),
        ((), "words+symbols", False),
        ((3,), "words", True),
    ],
)
def test_lowercase_segmented_model_with_a_combiner_scores_the_same(
    shape_sizes: tuple[int, ...], word_view: str, is_lowercase: bool
) -> None:
    """request_probabilities on random weights: lowercasing, both segments, empty ones, with
    and without the shape view and the word view."""
    spec = FeatureSpec(
        ngram_sizes=(1, 3, 5), num_bits=12, is_lowercase=is_lowercase, shape_sizes=shape_sizes,
        word_view=word_view,
    )  # fmt: skip
    rng = np.random.default_rng(2)
    weights = rng.normal(size=(3, spec.num_buckets)).astype(np.float32)
    bias = np.zeros(3, dtype=np.float32)
    combiner = Combiner(
        rng.normal(size=(16, 8)), rng.normal(size=16), rng.normal(size=(3, 16)), rng.normal(size=3)
    )
    native, slow = (
        LinearClassifier(spec, TASKS, weights, bias, combiner=combiner, scorer=scorer)
        for scorer in ("native", "numpy")
    )
    for focus, context in zip(TEXTS, [*TEXTS[7:], *TEXTS[:7]], strict=True):
        fast_guess, slow_guess = (
            native.classify_segments([focus, context]),
            slow.classify_segments([focus, context]),
        )
        assert fast_guess.task == slow_guess.task, (focus, context)
        for task in TASKS:
            assert fast_guess.scores[task] == pytest.approx(slow_guess.scores[task], abs=1e-5)


WEIGHTS = np.zeros((3, 1 << 8), dtype=np.float32)


@needs_native
@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("ab", WEIGHTS, 8, (1,), 0), TypeError, "data must be bytes"),
        ((b"ab", WEIGHTS.tolist(), 8, (1,), 0), TypeError, "weights must be a C-contiguous"),
        ((b"ab", WEIGHTS.astype(np.float64), 8, (1,), 0), ValueError, "dtype float32"),
        ((b"ab", WEIGHTS[0], 8, (1,), 0), ValueError, "2-dimensional"),
        ((b"ab", np.zeros((3, 512), np.float32)[:, ::2], 8, (1,), 0), ValueError, "C-contig"),
        ((b"ab", WEIGHTS, 9, (1,), 0), ValueError, "256 columns but num_bits 9"),
        ((b"ab", WEIGHTS, 0, (1,), 0), ValueError, r"num_bits is 0; it must be in \[1, 32\]"),
        ((b"ab", WEIGHTS, 8.0, (1,), 0), TypeError, "num_bits must be an int"),
        ((b"ab", WEIGHTS, 8, 3, 0), TypeError, "sizes must be a tuple of ints"),
        ((b"ab", WEIGHTS, 8, (1, "3"), 0), TypeError, r"sizes\[1\] must be an int"),
        ((b"ab", WEIGHTS, 8, (0,), 0), ValueError, r"sizes\[0\] is 0; n-gram sizes must be"),
        ((b"ab", WEIGHTS, 8, (65,), 0), ValueError, r"sizes\[0\] is 65"),
        ((b"ab", WEIGHTS, 8, (2**70,), 0), ValueError, r"sizes\[0\] is"),
        ((b"ab", WEIGHTS, 8, (1,), -1), ValueError, "segment is -1"),
        ((b"ab", WEIGHTS, 8, (1,)), TypeError, r"takes 5 arguments \(4 given\)"),
    ],
)
def test_segment_sums_rejects_bad_arguments(
    args: tuple[Any, ...], error: type[Exception], message: str
) -> None:
    from controller.classifier._ngram import segment_sums

    with pytest.raises(error, match=message):
        segment_sums(*args)


MLP = (np.zeros((4, 8)), np.zeros(4), np.zeros((3, 4)), np.zeros(3))
NO_SHAPE = (SHAPE_TABLE, ())


@needs_native
@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("a", "b", WEIGHTS, 8, (1,), 8.0, *MLP[:3]), TypeError, r"takes 12 or 13 arguments \(9"),
        (
            (b"a", "b", WEIGHTS, 8, (1,), 8.0, *MLP, *NO_SHAPE),
            TypeError,
            "focus must be a str, not bytes",
        ),
        (("a", None, WEIGHTS, 8, (1,), 8.0, *MLP, *NO_SHAPE), TypeError, "context must be a str"),
        (
            ("a", "b", WEIGHTS, 9, (1,), 8.0, *MLP, *NO_SHAPE),
            ValueError,
            "256 columns but num_bits 9",
        ),
        (("a", "b", WEIGHTS, 8, (1,), 0.0, *MLP, *NO_SHAPE), ValueError, "length_scale is 0.0"),
        (
            ("a", "b", WEIGHTS, 8, (1,), "8", *MLP, *NO_SHAPE),
            TypeError,
            "length_scale must be a float",
        ),
        (("a", "b", WEIGHTS, 8, (0,), 8.0, *MLP, *NO_SHAPE), ValueError, r"sizes\[0\] is 0"),
        (
            ("a", "b", WEIGHTS, 8, (1,), 8.0, MLP[0][:, :7].copy(), *MLP[1:], *NO_SHAPE),
            ValueError,
            "shapes",
        ),
        (
            ("a", "b", WEIGHTS, 8, (1,), 8.0, *MLP[:2], MLP[2].T, MLP[3], *NO_SHAPE),
            ValueError,
            "w2 must be C-",
        ),
        (
            (
                "a",
                "b",
                WEIGHTS,
                8,
                (1,),
                8.0,
                MLP[0],
                MLP[1].astype(np.float32),
                *MLP[2:],
                *NO_SHAPE,
            ),
            ValueError,
            "b1 must have dtype float64",
        ),
        (
            ("a", "b", WEIGHTS, 8, (1,), 8.0, *MLP[:3], None, *NO_SHAPE),
            TypeError,
            "b2 must be a C-contig",
        ),
        (
            ("a", "b", WEIGHTS, 8, (1,), 8.0, *MLP, b"ab", ()),
            TypeError,
            "shape_table must be bytes",
        ),
        (
            ("a", "b", WEIGHTS, 8, (1,), 8.0, *MLP, SHAPE_TABLE, (0,)),
            ValueError,
            r"sizes\[0\] is 0",
        ),
        (("a", "b", WEIGHTS, 8, (1,), 8.0, *MLP, *NO_SHAPE, 3), ValueError, r"word_mode is 3"),
        (("a", "b", WEIGHTS, 8, (1,), 8.0, *MLP, *NO_SHAPE, "words"), TypeError, "word_mode must"),
    ],
)
def test_request_probabilities_rejects_bad_arguments(
    args: tuple[Any, ...], error: type[Exception], message: str
) -> None:
    from controller.classifier._ngram import request_probabilities

    with pytest.raises(error, match=message):
        request_probabilities(*args)


@needs_native
def test_request_probabilities_of_text_without_ngrams_is_none() -> None:
    from controller.classifier._ngram import request_probabilities

    assert request_probabilities("", "", WEIGHTS, 8, (1, 3), 8.0, *MLP, *NO_SHAPE) is None
    assert request_probabilities("ab", "", WEIGHTS, 8, (3,), 8.0, *MLP, *NO_SHAPE) is None
    assert request_probabilities("ab", "", WEIGHTS, 8, (3,), 8.0, *MLP, SHAPE_TABLE, (4,)) is None
    probabilities = request_probabilities("abc", "", WEIGHTS, 8, (3,), 8.0, *MLP, *NO_SHAPE)
    assert probabilities == pytest.approx([1 / 3] * 3)


def test_env_var_forces_the_numpy_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NATIVE_ENV, "0")
    classifier = load_classifier(None)
    assert classifier.scorer == "numpy"
    assert "scorer: numpy" in format_report(evaluate(classifier, []))
    monkeypatch.delenv(NATIVE_ENV)
    assert load_classifier(None).scorer == ("native" if HAS_NATIVE else "numpy")


def test_asking_for_native_without_the_extension_names_the_fix(
    builtin: LinearClassifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model, "HAS_NATIVE", False)
    monkeypatch.delenv(NATIVE_ENV, raising=False)
    assert model.default_scorer() == "numpy"
    with pytest.raises(ValueError, match=re.escape("reinstall with a C compiler")):
        LinearClassifier(
            builtin.spec,
            builtin.tasks,
            builtin.weights,
            builtin.bias.astype(np.float32),
            scorer="native",
        )


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": text}
        for text in ("", "Write a short poem about the sea.", PROSE * 100, CJK)
    ]
    + [{"role": "user"}, {"role": "user", "content": None}, {"role": "system", "content": "x"}]
    + [{"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"content": "no role"}],
)
def test_one_turn_fast_path_gives_what_the_general_path_gives(message: dict[str, Any]) -> None:
    """text.py skips its general path for a plain dict (a MappingProxyType takes it)."""
    for max_chars in (4000, 10, 1):
        general = chat_pieces([MappingProxyType(message)], max_chars)
        assert chat_pieces([message], max_chars) == general
        body = {"messages": [message]}
        proxied = {"messages": [MappingProxyType(message)]}
        assert request_segments(body, max_chars) == request_segments(proxied, max_chars)


def test_type_fast_paths_give_what_the_abc_checks_give() -> None:
    """Plain dicts and lists take the ``type(x) is`` fast paths, proxies and tuples do not."""
    for body in corpus_bodies():
        messages = body.get("messages")
        if messages is None:
            continue
        slow = tuple(MappingProxyType(message) for message in messages)
        assert request_segments(body) == request_segments({"messages": slow})
