"""vLLM adaptive verification on a padded batch: scoring, budget, collapse and learning."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from policies.baselines.ragged_cost import TableRaggedCost
from policies.baselines.vllm_av import VllmAdaptiveVerification, VllmAvSettings
from policies.costmodel import CostModel, CostTable
from policies.types import StepCost, StepRow, Task


class WidthCost:
    """T(B, k): 1 for a plain step, 1.3 up to width 8, ``wide`` up to width 16 (any B)."""

    def __init__(self, wide: float = 2.0):
        self.wide = wide

    def step_time_s(self, batch_size: int, spec_tokens: int) -> float:
        if spec_tokens == 0:
            return 1.0
        return 1.3 if spec_tokens <= 7 else self.wide


def _policy(
    collapse: str = "objective", cost: StepCost | None = None, refit_interval_steps: int = 100
) -> VllmAdaptiveVerification:
    settings = VllmAvSettings(15, collapse=collapse, refit_interval_steps=refit_interval_steps)
    return VllmAdaptiveVerification(settings, cost or WidthCost())


def _rows(
    confidence: dict[str, float | None],
    history: dict[str, tuple[list[int], list[int]]] | None = None,
) -> list[StepRow]:
    history = history or {}
    out = []
    for rid, q in confidence.items():
        lengths, ks = history.get(rid, ([], []))
        conf = None if q is None else [q] * 15
        out.append(StepRow(rid, Task.MATH, tuple(lengths), tuple(ks), 15, conf))
    return out


# One confident row (q = 0.99: p = sigmoid(0.5 logit(0.99) - 0.2) = 0.89 per position) and one
# doubtful row (q = 0.01: p = 0.076). vLLM's budget admits the confident row's 14 best slots
# (14 drafts cost a width-8 step when spread over 2 rows), so its allocation is (14, 0): the
# "max" collapse verifies k = 14, a width-16 step. The padded objective sees that width 16
# costs 2.0 and takes k = 7 (2 + 4.53 + 0.08 tokens / 1.3 beats 2 + 6.71 + 0.08 / 2.0).
# Without confidence every slot scores the EMA's cold-start survival, 1: the whole block.
@pytest.mark.parametrize(
    ("collapse", "with_confidence", "expected"),
    [("objective", True, 7), ("max", True, 14), ("objective", False, 15), ("max", False, 15)],
)
def test_confidence_and_the_collapse_rule_set_the_width(
    collapse: str, with_confidence: bool, expected: int
) -> None:
    qs: dict[str, float | None] = (
        {"a": 0.99, "b": 0.01} if with_confidence else {"a": None, "b": None}
    )
    choice = _policy(collapse).decide_step(_rows(qs), 2)
    assert choice.spec_tokens == expected
    assert ("est=confidence" in choice.reason) == with_confidence
    assert "budget=" in choice.reason
    assert choice.reason.startswith("vllm-av: " if collapse == "objective" else "vllm-av-max: ")


def _run(
    policy: VllmAdaptiveVerification,
    steps: int,
    confidence: dict[str, float | None],
    accepted: Callable[[int], int],
) -> list[int]:
    """Closed loop: each step every row accepts ``accepted(k)`` of the k verified."""
    history: dict[str, tuple[list[int], list[int]]] = {rid: ([], []) for rid in confidence}
    chosen = []
    for _ in range(steps):
        k = policy.decide_step(_rows(confidence, history), len(confidence)).spec_tokens
        for lengths, ks in history.values():
            lengths.append(accepted(k) + 1)
            ks.append(k)
        chosen.append(k)
    return chosen


def test_without_confidence_the_ema_alone_learns_to_stop_drafting() -> None:
    policy = _policy()
    chosen = _run(policy, 40, {"a": None, "b": None}, lambda k: 0)
    assert chosen[0] == 15  # cold start: survival 1 everywhere
    assert chosen[-1] == 0  # 0.8^n: drafting stops once 14 s < 0.6 (k = 7 vs plain)
    assert chosen == sorted(chosen, reverse=True)
    assert policy.ema.survival[0] < 0.05
    assert policy.logistic.refits == 0  # nothing scored from confidence: nothing to fit


def test_outcomes_of_confidence_scored_rows_refit_the_logistic_every_100_steps() -> None:
    policy = _policy(cost=WidthCost(wide=1.3))  # width 16 as cheap as 8: always k = 15
    chosen = _run(policy, 100, {"a": 0.5, "b": 0.5}, lambda k: k)
    assert set(chosen) == {15}
    assert policy.logistic.refits == 1
    assert (policy.logistic.intercepts > -0.2).all()  # every position was accepted


def test_labels_use_the_k_the_engine_ran_not_the_k_chosen() -> None:
    policy = _policy(refit_interval_steps=1)
    assert policy.decide_step(_rows({"a": 0.5}), 1).spec_tokens == 7  # survival 0.45^j
    # The engine clamped the row to 3 drafts (near its end) and all 3 were accepted:
    # positions 1-3 are successes, position 4 was never verified (no failure there).
    policy.decide_step(_rows({"a": 0.5}, {"a": ([4], [3])}), 1)
    intercepts = policy.logistic.intercepts
    assert (intercepts[:3] > -0.2).all()
    assert intercepts[3:] == pytest.approx([-0.2] * 12)


def test_rows_without_confidence_score_from_the_ema_beside_confident_rows() -> None:
    choice = _policy().decide_step(_rows({"a": 0.01, "b": None}), 2)
    assert choice.spec_tokens == 15  # row b's cold-start survival 1 pays for the block
    assert "est=confidence" in choice.reason


# Shaped like the measured Qwen3-8B H200 table: width 8 costs ~1.16x at batch 1, ~1.9x at 64.
TABLE = CostTable(
    batch_sizes=(1, 8, 64),
    tokens_per_request=(1, 8, 16),
    step_time_s=((7.5e-3, 8.7e-3, 8.7e-3), (8.4e-3, 9.0e-3, 9.7e-3), (11.5e-3, 22e-3, 37.8e-3)),
)


@pytest.mark.parametrize(
    ("batch", "q", "expected"),
    [(1, 0.99, 15), (64, 0.01, 0), (64, 0.99, 7)],
)
def test_on_the_h200_shaped_table_load_and_confidence_move_the_width(
    batch: int, q: float, expected: int
) -> None:
    cost = CostModel(TABLE, block_size=16, verify_width_multiple=8).snapshot()
    rows = _rows({f"r{i}": q for i in range(batch)})
    assert _policy(cost=cost).decide_step(rows, batch).spec_tokens == expected


def test_bad_confidence_and_settings_are_errors_that_name_them() -> None:
    short = StepRow("a", Task.CODE, (), (), 15, [0.9] * 4)
    with pytest.raises(ValueError, match=r"row 'a'.*4 positions"):
        _policy().decide_step([short], 1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        _policy().decide_step(_rows({"a": 1.5}), 1)
    with pytest.raises(ValueError, match="collapse"):
        VllmAvSettings(15, collapse="mean")
    with pytest.raises(ValueError, match="min_spec_tokens"):
        VllmAvSettings(15, min_spec_tokens=16)


def test_an_empty_batch_drafts_nothing() -> None:
    assert _policy().decide_step([], 0).spec_tokens == 0


def test_the_ragged_cost_prices_draft_tokens_unpadded_and_meets_the_padded_table() -> None:
    model = CostModel(TABLE, block_size=16, verify_width_multiple=8)
    padded, ragged = model.snapshot(), TableRaggedCost(model)
    for batch in (1, 8, 64):
        for k in (0, 7, 15):  # whole captured widths: the same step
            assert ragged.step_time_s(batch, k * batch) == pytest.approx(
                padded.step_time_s(batch, k)
            )
    # One draft on 64 rows is 65 tokens, not a width-8 step of 512.
    assert ragged.step_time_s(64, 1) < 0.7 * padded.step_time_s(64, 1)


@pytest.mark.parametrize(("with_ragged_cost", "expected"), [(False, 0), (True, 3)])
def test_vllms_budget_at_token_granularity_can_overpay_on_a_padded_engine(
    with_ragged_cost: bool, expected: int
) -> None:
    """64 rows at q = 0.7 (p = 0.56): priced per token, 3 drafts a row pay for themselves, so
    vLLM's allocation is 3 each; a padded engine then pays a width-8 step for them. Priced by
    padded steps, the first draft already costs a whole width-8 step and the budget is 0."""
    model = CostModel(TABLE, block_size=16, verify_width_multiple=8)
    ragged = TableRaggedCost(model) if with_ragged_cost else None
    settings = VllmAvSettings(15, collapse="max")
    policy = VllmAdaptiveVerification(settings, model.snapshot(), ragged)
    rows = _rows({f"r{i}": 0.7 for i in range(64)})
    assert policy.decide_step(rows, 64).spec_tokens == expected


def test_prepare_builds_the_budget_costs_without_changing_decisions() -> None:
    model = CostModel(TABLE, block_size=16, verify_width_multiple=8)
    settings = VllmAvSettings(15, collapse="max")
    cold = VllmAdaptiveVerification(settings, model.snapshot(), TableRaggedCost(model))
    warm = VllmAdaptiveVerification(settings, model.snapshot(), TableRaggedCost(model))
    warm.prepare(64)
    for batch in (1, 8, 64):
        rows = _rows({f"r{i}": 0.8 for i in range(batch)})
        assert warm.decide_step(rows, batch) == cold.decide_step(rows, batch)


def test_confidence_may_arrive_as_numpy_arrays() -> None:
    rows = [
        StepRow(r, Task.MATH, (), (), 15, np.full(15, q)) for r, q in (("a", 0.99), ("b", 0.01))
    ]
    assert _policy().decide_step(rows, 2).spec_tokens == 7  # as with lists (first test)


def test_the_device_scoring_is_the_logistic_and_observed_steps_teach_it() -> None:
    """vLLM's split: the budget from the confidence the rows carry, the scoring the logistic
    applies to the fresh confidence; scoring learns nothing (an engine may score ahead and
    drop it), ``observed`` learns from each step that ran, with the scoring's own
    predictions."""
    from policies.baselines.logistic_acceptance import confidence_features
    from policies.slot_scoring import survival

    policy = _policy(refit_interval_steps=5)
    policy.logistic.slope = 0.8
    policy.logistic.intercepts = np.linspace(0.3, -0.5, 15)
    rows = _rows({"a": 0.9, "b": 0.3, "c": None})
    choice, scoring = policy.device_scoring(rows, 3)
    assert choice.reason.endswith("(device)") and 0 < scoring.budget <= 45
    fresh = np.random.default_rng(5).uniform(0, 1, (3, 15))
    expected = np.cumprod(policy.logistic.predict(confidence_features(fresh, 40.0)), axis=1)
    assert np.allclose(survival(scoring, fresh), expected, rtol=1e-12)
    assert policy._scored is None  # nothing kept for the host path's learning
    again = policy.device_scoring(rows, 3)[1]
    assert np.array_equal(again.base, scoring.base) and again.budget == scoring.budget
    ema = policy.ema.survival.copy()
    # confident slots always accepted, doubtful ones rejected at once
    confidence = [[0.99] * 15, [0.02] * 15, [0.99] * 15]
    for _ in range(10):
        policy.observed(scoring, confidence, [8, 8, 8], [9, 1, 9])
    assert policy.logistic.slope > 0.8  # the refits (every 5 steps) steepen the slope
    assert policy.ema.survival[0] < ema[0]  # one row in three rejects its first draft
    with pytest.raises(ValueError, match="needs rows"):
        policy.device_scoring([], 1)
