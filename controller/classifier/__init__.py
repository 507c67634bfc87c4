"""Request classification: math / code / chat, for choosing draft lengths.

The gateway uses :func:`load_classifier` once at start-up, then per request
``apply_threshold(classifier.classify(body), min_confidence, fallback_task)``.
Training, the corpus and evaluation live in ``training.classifier`` (scipy, scikit-learn and
the data packages are imported only there); the daemon never imports it.
"""

from controller.classifier.artifact import ArtifactError, load_classifier
from controller.classifier.base import Classifier, TaskGuess, apply_threshold
from controller.classifier.config import ClassifierConfig

__all__ = [
    "ArtifactError",
    "Classifier",
    "ClassifierConfig",
    "TaskGuess",
    "apply_threshold",
    "load_classifier",
]
