"""Hashed byte n-gram features, computed with numpy alone.

Training and inference call the same function, so the trained weights and the daemon can
never disagree about a feature. The text is UTF-8 encoded (any script works; lone
surrogates become '?') and every byte n-gram of the configured sizes is hashed into one of
``2**num_bits`` buckets:

    h_1 = byte[i];  h_n = h_{n-1} * PRIME + byte[i + n - 1]          (uint32, wrapping)
    bucket = ((h_n + n * SALT + segment * SEGMENT_SALT) * MULTIPLIER) >> (32 - num_bits)

``segment`` is 0 for the last user turn (or the prompt) and 1 for the context around it
(``text.request_segments``), so the two places get separate weights when the spec is
``is_segmented``; segment 0 hashes exactly as an unsegmented spec does.

Beside the bytes, a spec may read a *shape view* of the same text (``shape_sizes``): every
byte mapped by ``SHAPE_TABLE`` (lowercase letters to ``a``, uppercase to ``A``, digits to
``0``, blanks to a space, line breaks to ``\n``, UTF-8 lead and continuation bytes to one
value each, punctuation and operators kept), hashed the same way with segment ``segment +
2``. Its n-grams (``a(a) {``, ``0 + 0 = 0``, ``ÀÀÀ 0a``) carry code layout and
digit/operator structure that do not depend on identifiers or on the human language. They
count towards the segment's N.

A spec may also read a *word view* (``word_view``, #17 fifth follow-up): the ASCII words of
the text (maximal runs of ``[A-Za-z0-9_]``, lowercased; with ``"words+symbols"`` also every
other printable ASCII byte as a one-byte token), each hashed whole,

    h = byte[0];  h = h * PRIME + byte[k]   over the word's bytes                (uint32)
    bucket = ((h + (segment + WORD_SEGMENT_OFFSET) * SEGMENT_SALT) * MULTIPLIER) >> (32 - num_bits)

and scored with its **own** 1/sqrt(number of words), added to the segment's score. A tool
name, SQL keyword, file name or number inside Russian, Japanese or Korean text is one or two
words among hundreds of byte n-grams of the other script: in the byte view its n-grams are
drowned by 1/sqrt(N), in the word view it carries the segment's whole word score. The words
do not count towards the segment's N (the combiner's length input).

uint32 rather than uint64 halves the memory traffic (~10% faster at 4,000 characters).

A linear model over the L1-normalised bucket counts then scores a text as the *mean* of the
weight rows of its n-grams, which needs no counting: ``weights[buckets].mean(axis=0)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from controller.classifier.text import request_segments, request_text

PRIME = np.uint32(16_777_619)  # the 32-bit FNV prime
SALT = 0x9E3779B9
MULTIPLIER = np.uint32(0x85EBCA6B)  # odd, from murmur3's finaliser
SEGMENT_SALT = 0x7F4A7C15
# The shape view's segment is the text's segment + SHAPE_SEGMENT_OFFSET (0/1 are the bytes').
SHAPE_SEGMENT_OFFSET = 2
# The word view's segment is the text's segment + WORD_SEGMENT_OFFSET.
WORD_SEGMENT_OFFSET = 4
WORD_VIEWS = ("", "words", "words+symbols")
EMPTY: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)
EMPTY.flags.writeable = False


@dataclass(frozen=True)
class FeatureSpec:
    """How text becomes buckets; stored in the artifact manifest."""

    # (1, 3, 5) matched (1, 2, 3, 4, 5) on held-out accuracy (94.3% vs 94.4%) and is ~30%
    # faster at 4,000 characters; see docs/classifier.md.
    ngram_sizes: tuple[int, ...] = (1, 3, 5)
    # 2**16 buckets matched 2**18 (94.2% vs 94.3%) with a 4x smaller artifact.
    num_bits: int = 16
    is_lowercase: bool = False
    # Context n-grams hash apart from the last turn's (+0.8 points held-out; docs/classifier.md).
    is_segmented: bool = True
    # n-gram sizes of the shape view (empty: none, as in artifacts written before #17).
    shape_sizes: tuple[int, ...] = ()
    # ASCII word tokens with their own normalisation ("": none, as before the fifth #17
    # follow-up; "words"; "words+symbols"; module docstring).
    word_view: str = ""

    def __post_init__(self) -> None:
        assert self.word_view in WORD_VIEWS, f"word_view must be one of {WORD_VIEWS}"
        assert self.ngram_sizes and min(self.ngram_sizes) >= 1, "n-gram sizes must be >= 1"
        assert min(self.shape_sizes, default=1) >= 1, "shape n-gram sizes must be >= 1"
        assert 1 <= self.num_bits <= 32, "num_bits must be in [1, 32]"

    @property
    def num_buckets(self) -> int:
        return 1 << self.num_bits


def _shape_table() -> bytes:
    table = bytearray(range(256))
    for value in range(256):
        char = chr(value)
        if char.islower() and value < 128:
            table[value] = ord("a")
        elif char.isupper() and value < 128:
            table[value] = ord("A")
        elif char.isdigit() and value < 128:
            table[value] = ord("0")
        elif value in (10, 13):
            table[value] = 10
        elif value < 33 or value == 127:
            table[value] = 32
        elif value >= 0xC0:
            table[value] = 0xC0  # the first byte of a non-ASCII character
        elif value >= 0x80:
            table[value] = 0x80  # a continuation byte
    return bytes(table)


SHAPE_TABLE = _shape_table()
SHAPE_LOOKUP = np.frombuffer(SHAPE_TABLE, dtype=np.uint8)


def _word_tables() -> tuple[bytes, bytes]:
    """[256] byte -> word class (1 word byte, 2 symbol, 0 other) and byte -> lowercase."""
    classes = bytearray(256)
    for value in range(33, 127):
        char = chr(value)
        classes[value] = 1 if char.isalnum() or char == "_" else 2
    lower = bytes(ord(chr(value).lower()) if value < 128 else value for value in range(256))
    return bytes(classes), lower


WORD_CLASSES, WORD_LOWER = _word_tables()
_CLASS_LOOKUP = np.frombuffer(WORD_CLASSES, dtype=np.uint8)
_LOWER_LOOKUP = np.frombuffer(WORD_LOWER, dtype=np.uint8)
WORD_MODES = {view: mode for mode, view in enumerate(WORD_VIEWS)}  # the C scorer's argument
_POWERS = np.ones(1, dtype=np.uint64)


def _prime_powers(count: int) -> npt.NDArray[np.uint64]:
    """PRIME**k mod 2**32 for k < count (cached, grown on demand)."""
    global _POWERS
    if _POWERS.size < count:
        powers = np.empty(max(count, 2 * _POWERS.size), dtype=np.uint64)
        value = 1
        for k in range(powers.size):
            powers[k] = value
            value = (value * int(PRIME)) & 0xFFFFFFFF
        _POWERS = powers
    return _POWERS[:count]


def word_buckets(
    data: npt.NDArray[np.uint8], spec: FeatureSpec, segment: int
) -> npt.NDArray[np.intp]:
    """The buckets of the word view's tokens of ``data``, in text order (module docstring)."""
    if not spec.word_view or not data.size:
        return EMPTY
    classes = _CLASS_LOOKUP[data]
    is_word = classes == 1
    # A symbol is a token of its own; a word runs over consecutive word bytes.
    is_symbol = classes == 2 if spec.word_view == "words+symbols" else np.zeros_like(is_word)
    is_token = is_word | is_symbol
    if not is_token.any():
        return EMPTY
    previous = np.concatenate([[False], is_word[:-1]])
    starts = np.flatnonzero(is_symbol | (is_word & ~previous))
    positions = np.flatnonzero(is_token)
    # The token of each token byte, and the token's end: h = sum byte * PRIME**(end - 1 - i).
    token_of = np.searchsorted(starts, positions, side="right") - 1
    ends = np.empty(starts.size, dtype=np.intp)
    ends[:-1] = positions[np.searchsorted(positions, starts[1:]) - 1] + 1
    ends[-1] = positions[-1] + 1
    powers = _prime_powers(int((ends - starts).max()))
    exponents = ends[token_of] - 1 - positions
    terms = _LOWER_LOOKUP[data[positions]].astype(np.uint64) * powers[exponents]
    token_starts = np.searchsorted(positions, starts)
    hashes = (np.add.reduceat(terms, token_starts) & 0xFFFFFFFF).astype(np.uint32)
    salt = np.uint32(((segment + WORD_SEGMENT_OFFSET) * SEGMENT_SALT) % 2**32)
    shift = np.uint32(32 - spec.num_bits)
    return (((hashes + salt) * MULTIPLIER) >> shift).astype(np.intp)


def text_bytes(text: str, spec: FeatureSpec) -> npt.NDArray[np.uint8]:
    if spec.is_lowercase:
        text = text.lower()
    return np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8)


def bucket_indexes(text: str, spec: FeatureSpec, segment: int = 0) -> npt.NDArray[np.intp]:
    """The bucket of every byte n-gram of ``text``, n-gram sizes concatenated (shape [N])."""
    if not text:
        return EMPTY  # the usual context of a single-turn request: skip ~10 us of numpy calls
    data = text_bytes(text, spec)
    buckets = byte_buckets(data, spec, segment, spec.ngram_sizes)
    if not spec.shape_sizes:
        return buckets
    shape = shape_buckets(data, spec, segment)
    return np.concatenate([buckets, shape]) if shape.size else buckets


def shape_buckets(
    data: npt.NDArray[np.uint8], spec: FeatureSpec, segment: int
) -> npt.NDArray[np.intp]:
    """The buckets of the shape view's n-grams of ``data`` (the module docstring)."""
    shape = SHAPE_LOOKUP[data]
    return byte_buckets(shape, spec, segment + SHAPE_SEGMENT_OFFSET, spec.shape_sizes)


def byte_buckets(
    data: npt.NDArray[np.uint8], spec: FeatureSpec, segment: int, sizes: tuple[int, ...]
) -> npt.NDArray[np.intp]:
    """The buckets of the byte n-grams of ``data`` for the n-gram ``sizes`` (a subset of the
    spec's), in the order of ``sizes``."""
    data32 = data.astype(np.uint32)
    shift = np.uint32(32 - spec.num_bits)
    parts: list[npt.NDArray[np.uint32]] = []
    rolling = data32
    for n in range(1, max(sizes, default=0) + 1):
        if n > 1:
            rolling = rolling[:-1] * PRIME + data32[n - 1 :]
        if n in sizes and rolling.size:
            salt = np.uint32((n * SALT + segment * SEGMENT_SALT) % 2**32)
            parts.append(((rolling + salt) * MULTIPLIER) >> shift)
    if not parts:
        return EMPTY
    return np.concatenate(parts).astype(np.intp)


def unigram_buckets(spec: FeatureSpec, segment: int) -> npt.NDArray[np.intp]:
    """[256]: the bucket of each byte value as a 1-gram of ``segment``."""
    return byte_buckets(np.arange(256, dtype=np.uint8), spec, segment, (1,))


def request_texts(body: Mapping[str, Any], spec: FeatureSpec, max_chars: int) -> list[str]:
    """The text of each segment of a request: ``[request_text]`` for an unsegmented spec,
    ``[last user turn or prompt, context]`` for a segmented one (``text.request_segments``)."""
    if not spec.is_segmented:
        return [request_text(body, max_chars)]
    return list(request_segments(body, max_chars))


def request_word_buckets(
    body: Mapping[str, Any], spec: FeatureSpec, max_chars: int
) -> list[npt.NDArray[np.intp]]:
    """The word view's buckets of a request, one array per segment (empty without the view)."""
    texts = request_texts(body, spec, max_chars)
    return [
        word_buckets(text_bytes(text, spec), spec, segment) if text else EMPTY
        for segment, text in enumerate(texts)
    ]


def request_buckets(
    body: Mapping[str, Any], spec: FeatureSpec, max_chars: int
) -> list[npt.NDArray[np.intp]]:
    """The buckets of a request, one array per segment, each scored with its own 1/sqrt(N).

    Segmented specs read the last user turn (segment 0) apart from the context (segment 1),
    so a long history cannot drown a short question.
    """
    texts = request_texts(body, spec, max_chars)
    return [bucket_indexes(text, spec, segment) for segment, text in enumerate(texts)]
