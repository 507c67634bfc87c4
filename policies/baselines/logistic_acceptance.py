"""vLLM's online acceptance estimator for drafters without a confidence head (DFlash, MTP, ...).

From vllm-project/vllm#52228 (merged; ``vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py``,
``OnlineAcceptanceEstimator``), here on the host in numpy instead of Triton kernels:

    p_k = sigmoid(slope * f_k + intercept_k),   f_k = logit(q_k) = log(q_k / (1 - q_k))

q_k the draft distribution's top-1 probability at position k (vLLM: ``logit(max q)``, the
temperature-scaled draft logits' most likely token against all others), clamped to +-40. One
slope shared by all positions, one intercept per position; cold start slope 0.5, intercepts
-0.2 (vLLM's median fit across five models).

Learning, per engine step (``observe`` then ``end_step``): a row that verified ``admitted``
drafts and accepted ``accepted`` of them labels position k (0-based) when
``k <= accepted and k < admitted``: 1 if ``k < accepted``, else 0 (the first rejection); later
positions are censored. Each label adds to IRLS sufficient statistics with weight
``p (1 - p)`` from the prediction made when the draft was scored. Every ``refit_interval_steps``
steps one damped Newton step is taken from that round's statistics alone, then they are
cleared: the slope's step is the Schur complement of the arrowhead information matrix (ridge
``ridge`` on every parameter), damped by ``n / (n + damping_observations)`` over the round's
labels, and dropped if it is NaN or would make the slope negative; each intercept then steps
by ``(g1_k - b_k step_w) / c_k``, damped by its own label count. Nothing else is kept, so old
rounds are forgotten (vLLM's way of following a drifting workload).
"""

from __future__ import annotations

import numpy as np

from policies.baselines.slot_budget import Floats, Ints


def confidence_features(confidence: Floats, max_log_odds: float = 40.0) -> Floats:
    """logit(q) of top-1 draft probabilities in [0, 1], clamped to +-``max_log_odds``."""
    with np.errstate(divide="ignore"):
        odds = np.log(confidence) - np.log1p(-confidence)
    return np.clip(odds, -max_log_odds, max_log_odds)


class LogisticAcceptance:
    def __init__(
        self,
        num_positions: int,
        refit_interval_steps: int = 100,
        damping_observations: float = 50.0,
        ridge: float = 1e-3,
        initial_slope: float = 0.5,
        initial_intercept: float = -0.2,
    ):
        if num_positions < 1 or refit_interval_steps < 1:
            raise ValueError("num_positions and refit_interval_steps must be >= 1")
        self.refit_interval_steps = refit_interval_steps
        self.damping = damping_observations
        self.ridge = ridge
        self.slope = initial_slope
        self.intercepts = np.full(num_positions, initial_intercept, dtype=np.float64)
        self.refits = 0
        self._steps_since_refit = 0
        self._info = np.zeros((num_positions, 3))  # per position: sum w f^2, sum w f, sum w
        self._grad = np.zeros((num_positions, 2))  # per position: sum r f, sum r
        self._counts = np.zeros(num_positions)  # labels per position this round

    def predict(self, features: Floats) -> Floats:
        """[rows, K] acceptance probability of each drafted position."""
        logits = self.slope * features + self.intercepts[None, : features.shape[1]]
        return 1.0 / (1.0 + np.exp(-logits))

    def observe(
        self, features: Floats, predictions: Floats, accepted: Ints, admitted: Ints
    ) -> None:
        """Fold one step's verified rows in. ``features`` / ``predictions``: [rows, K] as
        scored before the step; ``accepted`` / ``admitted``: [rows]."""
        positions = np.arange(features.shape[1])
        seen = (positions[None, :] <= accepted[:, None]) & (positions[None, :] < admitted[:, None])
        label = (positions[None, :] < accepted[:, None]).astype(np.float64)
        w = np.where(seen, predictions * (1.0 - predictions), 0.0)
        resid = np.where(seen, label - predictions, 0.0)
        k = features.shape[1]
        self._info[:k, 0] += (w * features * features).sum(axis=0)
        self._info[:k, 1] += (w * features).sum(axis=0)
        self._info[:k, 2] += w.sum(axis=0)
        self._grad[:k, 0] += (resid * features).sum(axis=0)
        self._grad[:k, 1] += resid.sum(axis=0)
        self._counts[:k] += seen.sum(axis=0)

    def end_step(self) -> None:
        """Count one engine step; refit every ``refit_interval_steps``."""
        self._steps_since_refit += 1
        if self._steps_since_refit >= self.refit_interval_steps:
            self._steps_since_refit = 0
            self.refit()

    def refit(self) -> None:
        """One damped Newton-IRLS step from this round's statistics, then a clean round."""
        a_k, b, c = self._info[:, 0], self._info[:, 1], self._info[:, 2] + self.ridge
        g0_k, g1 = self._grad[:, 0], self._grad[:, 1]
        n = self._counts
        a = a_k.sum() + self.ridge
        with np.errstate(divide="ignore", invalid="ignore"):
            step_w = (g0_k.sum() - (b * g1 / c).sum()) / (a - (b * b / c).sum())
            total = n.sum()
            step_w *= total / (total + self.damping)
            if not np.isfinite(step_w) or self.slope + step_w < 0.0:
                step_w = 0.0
            step_b = (g1 - b * step_w) / c * (n / (n + self.damping))
        self.slope += float(step_w)
        self.intercepts += np.where(np.isfinite(step_b), step_b, 0.0)
        self._info[:] = 0.0
        self._grad[:] = 0.0
        self._counts[:] = 0.0
        self.refits += 1
