"""Deterministic train / validation / held-out split by a hash of each example's group.

Three independent slices of one sha256 digest of the group: bytes 0-8 pick the held-out
split (never trained on), bytes 8-16 the combiner's cross-fitting fold, bytes 16-24 the
validation split carved from the training groups (model choices are made on it, never on
the held-out split).
"""

from __future__ import annotations

import hashlib

DEFAULT_HELD_OUT_PERCENT = 20
DEFAULT_VALIDATION_PERCENT = 20


def is_held_out(group: str, held_out_percent: int = DEFAULT_HELD_OUT_PERCENT) -> bool:
    """True for the ``held_out_percent`` of groups that training never sees.

    The bucket is the first 8 bytes of sha256(group) mod 100, so the split depends only on
    the text (or id) of the group: the same on every machine, run and Python version.
    """
    digest = hashlib.sha256(group.encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < held_out_percent


def fold_of(group: str, num_folds: int) -> int:
    """The cross-fitting fold of a training group: bytes 8-16 of the same digest, so folds
    are independent of the held-out split and keep a group's examples together."""
    digest = hashlib.sha256(group.encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[8:16], "big") % num_folds


def is_validation(group: str, validation_percent: int = DEFAULT_VALIDATION_PERCENT) -> bool:
    """True for the ``validation_percent`` of groups used to choose models; only the training
    groups among them matter (``Dataset.validation_mask``), so validation never overlaps the
    held-out split."""
    digest = hashlib.sha256(group.encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[16:24], "big") % 100 < validation_percent
