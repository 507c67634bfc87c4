"""Request classification: math / code / chat, for choosing draft lengths.

The gateway uses :func:`load_classifier` once at start-up, then per request
``apply_threshold(classifier.classify(body), min_confidence, fallback_task)``.
Heavy training dependencies (scipy, scikit-learn, data packages) are imported only by
``controller.classifier.training``.
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
