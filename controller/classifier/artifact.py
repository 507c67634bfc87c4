"""The trained artifact on disk: ``weights.npz`` (plain arrays) + ``manifest.json``.

Nothing is pickled: ``np.load(..., allow_pickle=False)`` reads the arrays and the manifest
says how text becomes features, which row is which task, and where the training data came
from. The built-in artifact lives in this package (``controller/classifier/artifact``).
"""

from __future__ import annotations

import importlib.resources
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from controller.classifier.combiner import combiner_from_arrays
from controller.classifier.features import FeatureSpec
from controller.classifier.model import LinearClassifier
from controller.classifier.text import DEFAULT_MAX_CHARS
from policies.types import Task

WEIGHTS_FILE = "weights.npz"
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1

logger = logging.getLogger(__name__)


class ArtifactError(ValueError):
    """An artifact folder that cannot be loaded; the message names the path and the fix."""


def builtin_artifact_dir() -> Path:
    return Path(str(importlib.resources.files("controller.classifier").joinpath("artifact")))


def save_artifact(model: LinearClassifier, folder: Path, manifest: dict[str, Any]) -> None:
    """Write the model's arrays and ``manifest`` (plus the feature spec) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = model.weights.astype(np.float16)
    arrays: dict[str, Any] = {  # Any: numpy stubs would match a value to allow_pickle
        "weights": weights,
        "bias": model.bias.astype(np.float32),
    }
    if model.combiner is not None:
        arrays.update(model.combiner.arrays())
    np.savez_compressed(folder / WEIGHTS_FILE, **arrays)
    spec = model.spec
    full = {
        "format_version": FORMAT_VERSION,
        "tasks": [str(task) for task in model.tasks],
        "combiner_hidden": model.combiner.w1.shape[0] if model.combiner is not None else 0,
        "features": {
            "ngram_sizes": list(spec.ngram_sizes),
            "num_bits": spec.num_bits,
            "is_lowercase": spec.is_lowercase,
            "is_segmented": spec.is_segmented,
            "shape_sizes": list(spec.shape_sizes),
            **({"word_view": spec.word_view} if spec.word_view else {}),
        },
        **manifest,
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise ArtifactError(
            f"{path}: missing; point classifier.artifact at a folder written by "
            "`draftctl classifier train --out FOLDER`"
        )
    manifest: dict[str, Any] = json.loads(path.read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{path}: format_version {manifest.get('format_version')!r} is not "
            f"{FORMAT_VERSION}; retrain with this draftctl"
        )
    return manifest


def load_classifier(
    artifact: str | Path | None = None, max_chars: int = DEFAULT_MAX_CHARS
) -> LinearClassifier:
    """Load a trained classifier; ``None`` loads the built-in committed artifact."""
    folder = Path(artifact) if artifact is not None else builtin_artifact_dir()
    manifest = read_manifest(folder)
    features = manifest["features"]
    spec = FeatureSpec(
        ngram_sizes=tuple(features["ngram_sizes"]),
        num_bits=int(features["num_bits"]),
        is_lowercase=bool(features["is_lowercase"]),
        is_segmented=bool(features.get("is_segmented", False)),  # absent before segments
        shape_sizes=tuple(features.get("shape_sizes", ())),  # absent before #17
        word_view=features.get("word_view", ""),  # absent before the fifth #17 follow-up
    )
    tasks = tuple(Task(name) for name in manifest["tasks"])
    with np.load(folder / WEIGHTS_FILE, allow_pickle=False) as arrays:
        weights = arrays["weights"].astype(np.float32)
        bias = arrays["bias"].astype(np.float32)
        try:
            combiner = combiner_from_arrays({name: arrays[name] for name in arrays.files})
        except ValueError as error:
            raise ArtifactError(
                f"{folder / WEIGHTS_FILE}: {error}; retrain the artifact"
            ) from error
    try:
        classifier = LinearClassifier(spec, tasks, weights, bias, max_chars, combiner)
    except ValueError as error:
        raise ArtifactError(f"{folder / WEIGHTS_FILE}: {error}; retrain the artifact") from error
    logger.info("classifier %s: %s scorer", folder, classifier.scorer)
    return classifier
