import numpy as np

from controller.classifier import ClassifierConfig, TaskGuess, apply_threshold
from controller.classifier.features import FeatureSpec
from controller.classifier.model import LinearClassifier
from policies.types import TASKS, Task

SCORES = {Task.MATH: 0.5, Task.CODE: 0.3, Task.CHAT: 0.2}


def test_confident_guess_is_kept() -> None:
    guess = TaskGuess(Task.MATH, 0.9, SCORES, 1e-5)
    assert apply_threshold(guess, 0.55, Task.CHAT) is guess


def test_unsure_guess_falls_back_but_keeps_what_the_model_thought() -> None:
    guess = TaskGuess(Task.MATH, 0.5, SCORES, 1e-5)
    result = apply_threshold(guess, 0.55, Task.CHAT)
    assert result.task == Task.CHAT and result.is_fallback
    assert result.confidence == 0.5 and result.scores == SCORES


def test_config_defaults_and_unknown_keys() -> None:
    config = ClassifierConfig()
    assert (config.min_confidence, config.fallback_task, config.max_chars) == (0.55, "chat", 4000)
    try:
        ClassifierConfig.model_validate({"min_confidance": 0.5})
    except ValueError as error:
        assert "min_confidance" in str(error)
    else:
        raise AssertionError("unknown key accepted")


def test_linear_probabilities_stay_finite_for_extreme_logits() -> None:
    spec = FeatureSpec(ngram_sizes=(1,), num_bits=8, is_segmented=False)
    weights = np.zeros((3, 256), dtype=np.float32)
    bias = np.array([-900.0, -800.0, -1000.0], dtype=np.float32)  # every sigmoid rounds to 0
    guess = LinearClassifier(spec, TASKS, weights, bias).classify({"prompt": "hello"})
    assert guess.task == TASKS[1] and np.isfinite(list(guess.scores.values())).all()
    assert abs(sum(guess.scores.values()) - 1.0) < 1e-9
