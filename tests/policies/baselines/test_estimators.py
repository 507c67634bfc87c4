"""vLLM's two acceptance estimators: the survival EMA (#52559) and the logistic (#52228)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from policies.baselines.logistic_acceptance import LogisticAcceptance, confidence_features
from policies.baselines.survival_ema import SurvivalEma


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# --- survival EMA ---------------------------------------------------------------------------


def test_ema_starts_at_one_and_moves_eligible_positions_by_the_weight() -> None:
    ema = SurvivalEma(5, history_weight=0.2)
    assert ema.survival.tolist() == [1.0] * 5
    # Two rows drafted 4 and accepted 1 and 3. Per position: reached 2/2, 1/2, 1/2, 0/2;
    # position 5 was drafted by nobody (stays 1, then the non-increasing pass caps it).
    ema.record_step([4, 4], [1, 3])
    assert ema.survival == pytest.approx([1.0, 0.9, 0.9, 0.8, 0.8])
    # One row drafted 2 and accepted none: 0.8 * 1 + 0.2 * 0, 0.8 * 0.9 + 0; then capped.
    ema.record_step([2], [0])
    assert ema.survival == pytest.approx([0.8, 0.72, 0.72, 0.72, 0.72])


def test_ema_ignores_steps_without_drafts_and_checks_its_settings() -> None:
    ema = SurvivalEma(3)
    ema.record_step([], [])
    ema.record_step([0, 0], [0, 0])
    assert ema.survival.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="history_weight"):
        SurvivalEma(3, history_weight=0.0)


# --- logistic estimator ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("q", "feature"),
    [(0.5, 0.0), (0.9, math.log(9.0)), (0.2, math.log(0.25)), (1.0, 40.0), (0.0, -40.0)],
)
def test_confidence_features_are_clamped_log_odds(q: float, feature: float) -> None:
    assert confidence_features(np.array([q]))[0] == pytest.approx(feature)


def test_cold_start_prediction_uses_vllms_median_coefficients() -> None:
    model = LogisticAcceptance(2)
    p = model.predict(np.array([[0.0, 2.0]]))
    assert p[0] == pytest.approx([_sigmoid(-0.2), _sigmoid(0.5 * 2.0 - 0.2)])


def test_labels_stop_at_the_first_rejection_and_refit_is_one_damped_newton_step() -> None:
    model = LogisticAcceptance(6, refit_interval_steps=1)
    features = np.zeros((1, 6))
    p = _sigmoid(-0.2)
    # 5 verified, 2 accepted: positions 1-2 accepted, 3 rejected, 4-6 never at risk.
    model.observe(features, np.full((1, 6), p), np.array([2]), np.array([5]))
    model.end_step()
    assert model.refits == 1
    # Feature 0 gives the slope no information: its step is 0. Each labelled intercept steps
    # by (label - p) / (p (1 - p) + ridge), damped by n / (n + 50) with n = 1.
    up = (1 - p) / (p * (1 - p) + 1e-3) / 51
    down = -p / (p * (1 - p) + 1e-3) / 51
    assert model.slope == pytest.approx(0.5)
    assert model.intercepts == pytest.approx([-0.2 + up, -0.2 + up, -0.2 + down] + [-0.2] * 3)


def test_a_fully_accepted_block_labels_every_verified_position_and_no_more() -> None:
    model = LogisticAcceptance(6, refit_interval_steps=1)
    p = _sigmoid(-0.2)
    model.observe(np.zeros((1, 6)), np.full((1, 6), p), np.array([5]), np.array([5]))
    model.end_step()
    assert (model.intercepts[:5] > -0.2).all()
    assert model.intercepts[5] == pytest.approx(-0.2)


def test_refits_wait_for_the_interval_and_start_each_round_clean() -> None:
    model = LogisticAcceptance(1, refit_interval_steps=100)
    p = _sigmoid(-0.2)
    for _ in range(99):
        model.observe(np.zeros((1, 1)), np.full((1, 1), p), np.array([1]), np.array([1]))
        model.end_step()
    assert model.refits == 0 and model.intercepts[0] == pytest.approx(-0.2)
    model.end_step()
    n = 99  # all labels 1: (1 - p) n / (p (1 - p) n + ridge), damped by n / (n + 50)
    step = (1 - p) * n / (p * (1 - p) * n + 1e-3) * n / (n + 50)
    assert model.refits == 1 and model.intercepts[0] == pytest.approx(-0.2 + step)
    for _ in range(100):  # a round without labels leaves the coefficients alone
        model.end_step()
    assert model.refits == 2 and model.intercepts[0] == pytest.approx(-0.2 + step)


def _train(model: LogisticAcceptance, sign: float, rounds: int) -> None:
    """Rows at feature +3 accepted and -3 rejected at position 1 (or the reverse)."""
    features = np.array([[3.0], [-3.0]])
    accepted = np.array([1, 0]) if sign > 0 else np.array([0, 1])
    for _ in range(rounds * model.refit_interval_steps):
        model.observe(features, model.predict(features), accepted, np.array([1, 1]))
        model.end_step()


def test_the_slope_learns_that_confident_drafts_survive() -> None:
    model = LogisticAcceptance(1, refit_interval_steps=10)
    _train(model, +1.0, rounds=10)
    assert model.slope > 1.0
    p = model.predict(np.array([[3.0], [-3.0]]))[:, 0]
    assert p[0] > 0.9 > 0.1 > p[1]


def test_a_step_that_would_turn_the_slope_negative_is_dropped_not_clipped() -> None:
    model = LogisticAcceptance(1, refit_interval_steps=10)
    _train(model, -1.0, rounds=10)
    assert model.slope == pytest.approx(0.5)  # every round's step overshoots below 0
    assert model.refits == 10
