"""Confidence-reading choosers on a simulated ragged engine (issue 16): the synthetic draft
confidence has the AUC asked for, and the allocator and vLLM's adaptive verification run
beside the other policies on the same arrivals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from policies.confidence_model import CONFIDENCE_BIAS, separation
from policies.types import Task
from sim.runner import run_scenario
from sim.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.mark.parametrize("auc", [0.6, 0.82, 0.95])
def test_the_synthetic_confidence_has_the_requested_auc(auc: float) -> None:
    rng = np.random.default_rng(0)
    gap = separation(auc)
    n = 20_000
    y = rng.random(n) < 0.5
    z = CONFIDENCE_BIAS + gap * (y - 0.5) + rng.normal(size=n)
    pos, neg = z[y], z[~y]
    measured = (pos[:, None] > rng.choice(neg, 400)[None, :]).mean()
    assert abs(measured - auc) < 0.02


def test_separation_refuses_an_auc_outside_half_to_one() -> None:
    with pytest.raises(ValueError, match="AUC"):
        separation(1.0)


def _ci_small(policies: str) -> str:
    """scenarios/ci-small.yaml (its cost table found from anywhere) with these lines added to
    its ``policies`` section and a draft confidence of AUC 0.82."""
    text = (SCENARIOS / "ci-small.yaml").read_text()
    text = text.replace("table: cost/", f"table: {SCENARIOS}/cost/")
    return text + policies + "acceptance:\n  confidence_auc: 0.82\n"


def test_allocator_and_vllm_av_run_on_a_small_ragged_scenario(tmp_path: Path) -> None:
    text = _ci_small("  include_allocator: true\n  include_vllm_av: true\n")
    path = tmp_path / "ragged.yaml"
    path.write_text(text)
    report = run_scenario(load_scenario(path))
    policies = report["policies"]
    for name in ("allocator", "vllm-av"):
        assert policies[name]["goodput_tok_s"] > policies["no-spec"]["goodput_tok_s"]
        assert policies[name]["goodput_tok_s"] <= policies["oracle"]["goodput_tok_s"] * 1.02


def test_the_two_phase_wait_is_charged_to_the_policies_that_read_confidence(
    tmp_path: Path,
) -> None:
    """cost.two_phase_wait_s (+ per row): the device idles between the draft and the verify of
    a step whose policy reads the draft's confidence; policies that choose k before the draft
    run exactly as without it, the allocator on one-phase steps (allocator-prior) too."""
    text = _ci_small(
        "  include_allocator: true\n  include_vllm_av: true\n  include_allocator_prior: true\n"
    )
    reports = {}
    for wait in (0.0, 0.004):
        cost = f"cost:\n  two_phase_wait_s: {wait}\n  two_phase_wait_per_row_s: {wait / 8}\n"
        path = tmp_path / f"wait-{wait}.yaml"
        path.write_text(text.replace("cost:\n", cost, 1))
        reports[wait] = run_scenario(load_scenario(path))["policies"]
    before, after = reports[0.0], reports[0.004]
    for name in ("no-spec", "static-k7", "goodput", "oracle", "allocator-prior"):
        assert after[name]["goodput_tok_s"] == before[name]["goodput_tok_s"], name
    assert before["allocator-prior"]["goodput_tok_s"] > before["no-spec"]["goodput_tok_s"]
    for name in ("allocator", "vllm-av"):
        assert after[name]["goodput_tok_s"] < 0.97 * before[name]["goodput_tok_s"], name


@pytest.mark.parametrize("min_rows", [32, 64])
def test_goodput_auto_runs_two_phase_steps_only_from_slots_min_batch(
    tmp_path: Path, min_rows: int
) -> None:
    """goodput-auto (the embedded engine's default step mode on ragged verifies): one k per
    step below ``slots_min_batch`` rows; from there the step-mode chooser tries both modes
    (ci-small's chat phase has 32 clients) and charges the two-phase steps the wait."""
    from engines.cost_tables import load_cost_table
    from sim.runner import build_choosers, engine_cost
    from sim.server import SimServer
    from sim.workload import Workload

    text = _ci_small(f"  include_goodput_auto: true\n  goodput:\n    slots_min_batch: {min_rows}\n")
    path = tmp_path / "auto.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    table = load_cost_table(scenario.resolve(scenario.cost.table))
    (auto,) = [c for c in build_choosers(scenario, table) if c.name == "goodput-auto"]
    report = SimServer(scenario, Workload(scenario), auto, engine_cost(scenario, table)).run()
    assert report.as_dict()["goodput_tok_s"] > 0
    steps = auto.two_phase_steps  # type: ignore[attr-defined]
    assert (steps > 0) if min_rows == 32 else (steps == 0)


def test_a_narrow_draft_factor_interpolates_in_log_batch_and_is_checked() -> None:
    from sim.scenario import Costs

    costs = Costs(narrow_draft_factor={1: 1.0, 64: 0.88})
    assert costs.narrow_factor(1) == 1.0 and costs.narrow_factor(128) == 0.88
    assert costs.narrow_factor(8) == pytest.approx(1.0 - 0.12 * 3 / 6)
    assert Costs().narrow_factor(64) == 1.0
    for bad in ({}, {0: 0.9}, {8: 1.5}):
        with pytest.raises(ValueError, match="narrow_draft_factor"):
            Costs(narrow_draft_factor=bad)


def test_narrow_drafts_cheapen_only_steps_that_draft_few_positions(tmp_path: Path) -> None:
    """cost.narrow_draft_factor: a step whose rows draft at most 7 positions pays that factor
    of the draft forward (static k <= 7, a capped allocator); steps that draft the whole block
    (static-k11, vllm-av, the uncapped allocator) cost what they did."""
    text = _ci_small("  include_allocator: true\n  include_vllm_av: true\n")
    reports = {}
    for name, extra in (
        ("whole", ""),
        ("narrow", "  narrow_draft_factor: {1: 0.5, 64: 0.5}\n"),
    ):
        path = tmp_path / f"{name}.yaml"
        path.write_text(text.replace("cost:\n", "cost:\n" + extra, 1))
        reports[name] = run_scenario(load_scenario(path))["policies"]
    whole, narrow = reports["whole"], reports["narrow"]
    assert narrow["static-k7"]["goodput_tok_s"] > 1.01 * whole["static-k7"]["goodput_tok_s"]
    for name in ("no-spec", "static-k15", "vllm-av", "allocator"):
        assert narrow[name]["goodput_tok_s"] == whole[name]["goodput_tok_s"], name


def test_a_capped_allocator_drafts_and_verifies_at_most_its_cap(tmp_path: Path) -> None:
    """goodput.slots_draft_cap in a scenario: the allocator's rows draft at most the cap (what
    the narrow draft cost reads) and are given at most that."""
    from engines.cost_tables import load_cost_table
    from sim.runner import build_choosers, engine_cost
    from sim.server import SimServer
    from sim.workload import Workload

    text = _ci_small("  include_allocator: true\n  goodput:\n    slots_draft_cap: 7\n")
    path = tmp_path / "capped.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    table = load_cost_table(scenario.resolve(scenario.cost.table))
    (allocator,) = [c for c in build_choosers(scenario, table) if c.name == "allocator"]
    assert allocator.last_drafted_positions == 7  # type: ignore[attr-defined]
    widest: list[int] = []
    choose = allocator.choose

    def recorded(batch: Any, now_s: float) -> list[int]:
        ks: list[int] = choose(batch, now_s)
        widest.append(max(ks))
        return ks

    allocator.choose = recorded  # type: ignore[method-assign]
    SimServer(scenario, Workload(scenario), allocator, engine_cost(scenario, table)).run()
    assert widest and max(widest) <= 7 and max(widest) >= 4


@pytest.mark.parametrize(
    ("cost", "want"),
    [
        ("batch_verify: ragged, verify_width_multiple: 1", 1),
        ("batch_verify: padded, verify_width_multiple: 1", 8),
    ],
)
def test_goodput_prices_steps_with_the_engines_multiple_on_a_ragged_engine(
    tmp_path: Path, cost: str, want: int
) -> None:
    """As the embedded engine hands its policy its table: a ragged engine's verify width
    multiple (every k priced at its own width); a padded engine leaves the policy's (8)."""
    from engines.cost_tables import load_cost_table
    from sim.runner import build_choosers

    text = _ci_small("  include_goodput_auto: true\n  include_informed: true\n")
    text = text.replace("cost:\n", f"cost:\n  {cost.split(', ')[0]}\n  {cost.split(', ')[1]}\n")
    path = tmp_path / "multiple.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    table = load_cost_table(scenario.resolve(scenario.cost.table))
    choosers = {c.name: c for c in build_choosers(scenario, table)}
    models = choosers["goodput"]._models
    assert models.cost is not None and models.cost.verify_width_multiple == want
    if want == 1:
        auto = choosers["goodput-auto"]._one._models
        assert auto.cost is not None and auto.cost.verify_width_multiple == 1


class _Fixed:
    """A stand-in chooser that answers one k for every row (tests the code above it)."""

    def __init__(self, k: int) -> None:
        self.k, self.calls = k, 0
        self.last_drafted_share: float | None = None
        self.last_drafted_positions: int | None = None

    def choose(self, batch: Any, now_s: float) -> list[int]:
        self.calls += 1
        return [self.k] * len(batch)

    def record(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("one_k", [0, 5])
def test_goodput_auto_runs_a_two_phase_incumbent_plain_while_one_phase_would(one_k: int) -> None:
    """The simulator's auto mode gates two-phase steps as the engine's does (session 56): a
    bucket whose incumbent is two-phase runs a step plain where the batch-wide decision is
    plain, and a plain step is timed into neither mode; where it drafts, two-phase as before."""
    from policies.model import GoodputSpec
    from policies.step_mode import ModeSettings, StepModeChooser
    from sim.ragged_choosers import GoodputAutoChooser

    spec = GoodputSpec(slots_min_batch=2, mode_probe_steps=2, mode_learn_steps=4)
    one, two = _Fixed(one_k), _Fixed(9)
    auto = GoodputAutoChooser(spec, one, two)  # type: ignore[arg-type]
    modes = StepModeChooser(ModeSettings.of(spec))
    while modes.incumbent(4) is None:
        chosen = modes.decide(4)
        modes.record(4, chosen, 20 if chosen else 10, 0.01)
    auto._modes = modes
    pairs = modes.buckets()[0].pairs
    batch = [object()] * 4
    for _ in range(6):
        ks = auto.choose(batch, 0.0)  # type: ignore[arg-type]
        auto.record(batch, ks, [1] * 4, (0.01, 0.0, 0.0))  # type: ignore[arg-type]
    assert ks == ([9] * 4 if one_k else [0] * 4)
    assert auto.two_phase_steps == (6 if one_k else 0)
    if not one_k:
        assert modes.buckets()[0].pairs == pairs and modes.incumbent(4) is True


def test_goodput_auto_alternates_both_modes_while_its_bucket_learns() -> None:
    """While a bucket learns, its schedule advances on every drafting step, one-phase ones
    too: blocks of ``mode_probe_steps`` of each mode in turn (a schedule advanced only on
    two-phase steps would stay on its first one-phase block for good)."""
    from policies.model import GoodputSpec
    from sim.ragged_choosers import GoodputAutoChooser

    spec = GoodputSpec(slots_min_batch=2, mode_probe_steps=2, mode_learn_steps=4)
    auto = GoodputAutoChooser(spec, _Fixed(5), _Fixed(9))  # type: ignore[arg-type]
    batch = [object()] * 4
    modes = []
    for _ in range(8):
        ks = auto.choose(batch, 0.0)  # type: ignore[arg-type]
        modes.append(ks[0] == 9)
        auto.record(batch, ks, [2] * 4, (0.01, 0.0, 0.0))  # type: ignore[arg-type]
    assert modes == [True, True, False, False, True, True, False, False]


def test_goodput_auto_counts_only_drafting_steps_in_its_schedule() -> None:
    """As the engine's: plain one-phase steps leave a learning bucket's schedule where it is
    (its one-phase block waits for steps that draft)."""
    from policies.model import GoodputSpec
    from policies.step_mode import ModeSettings, StepModeChooser
    from sim.ragged_choosers import GoodputAutoChooser

    spec = GoodputSpec(slots_min_batch=2, mode_probe_steps=2, mode_learn_steps=4)
    auto = GoodputAutoChooser(spec, _Fixed(0), _Fixed(9))  # type: ignore[arg-type]
    modes = StepModeChooser(ModeSettings.of(spec))
    modes.decide(4), modes.decide(4)  # the first (two-phase) learning block, spent
    auto._modes = modes
    batch = [object()] * 4
    for _ in range(6):
        ks = auto.choose(batch, 0.0)  # type: ignore[arg-type]
        auto.record(batch, ks, [1] * 4, (0.01, 0.0, 0.0))  # type: ignore[arg-type]
        assert ks == [0] * 4
    assert not modes.peek(4) and modes.incumbent(4) is None and modes.rates(4) == (None, None)


def _bound_choosers(tmp_path: Path, auc: float | None, min_k: int = 4) -> dict[str, Any]:
    """ci-small's bound choosers (``include_bayes_bound``) at this confidence AUC."""
    from engines.cost_tables import load_cost_table
    from sim.runner import build_choosers

    text = _ci_small(f"  include_bayes_bound: true\n  min_spec_tokens: {min_k}\n")
    text = text.replace("confidence_auc: 0.82", f"confidence_auc: {auc}" if auc else "{}")
    path = tmp_path / "bound.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    table = load_cost_table(scenario.resolve(scenario.cost.table))
    return {c.name: c for c in build_choosers(scenario, table) if c.name.startswith("bayes")}


def _traced(hard: list[int], position: int, rates: list[float], step: int = 0) -> Any:
    from sim.request import SimRequest
    from sim.traces import AcceptanceTrace
    from sim.workload import RequestSpec

    trace = AcceptanceTrace(4000, tuple(hard), tuple(rates))
    request = SimRequest(RequestSpec((1, 0, step), Task.MATH, 10, trace), 0, 0.0)
    request.position = position
    request.k_history = [0] * step  # (the synthetic confidence's draw is keyed on the step)
    return request


def _drawn_requests(
    count: int, seed: int, rates: tuple[float, float, float]
) -> tuple[list[Any], np.ndarray]:
    """``count`` parametric requests (first rate, last rate, request spread), each at a random
    position with its own confidence draw, and [count, 15] whether each slot survives."""
    import random

    from sim.scenario import ParametricTask
    from sim.traces import parametric_trace

    rng = random.Random(seed)
    model = ParametricTask(first_rate=rates[0], last_rate=rates[1], request_spread=rates[2])
    requests = []
    for step in range(count):
        trace = parametric_trace(model, 16, 600, rng)
        own = list(trace.true_rates or ())
        requests.append(_traced(list(trace.hard_positions), rng.randrange(500), own, step))
    truth = np.array([[j < r.peek_accepted(15) for j in range(15)] for r in requests])
    return requests, truth


def test_the_bayes_bound_builds_under_both_bounds_and_needs_a_confidence_auc(
    tmp_path: Path,
) -> None:
    assert sorted(_bound_choosers(tmp_path, 0.82)) == [
        "bayes-bound",
        "bayes-bound-min1",
        "bayes-prefix",
        "bayes-prefix-min1",
        "bayes-prefix-task",
    ]
    assert sorted(_bound_choosers(tmp_path, 0.82, min_k=1)) == [
        "bayes-bound-min1",
        "bayes-prefix-min1",
        "bayes-prefix-task-min1",
    ]
    with pytest.raises(ValueError, match="confidence_auc"):
        _bound_choosers(tmp_path, None)


def test_the_bayes_bound_prior_follows_the_run_the_hard_tokens_passed_leave(
    tmp_path: Path,
) -> None:
    """Uninformative confidence (AUC 0.5): the survival is the request's true rates from where
    its current run stands: a run starts after each hard token passed and again every block of
    16 positions (the bonus position of a full block always survives), not at position 0."""
    chooser = _bound_choosers(tmp_path, 0.5)["bayes-bound"]
    rates = [0.95 - 0.04 * i for i in range(15)]
    for hard, position, offset in (([], 0, 0), ([9], 12, 2), ([9, 30], 43, 12), ([], 16, 0)):
        survival = chooser.survival([_traced(hard, position, rates)])[0]
        runs = (offset + np.arange(15)) % 16
        expected = np.cumprod([rates[o] if o < 15 else 1.0 for o in runs])
        np.testing.assert_allclose(survival, expected, rtol=1e-9, err_msg=str((hard, position)))
    # the task variant: its task's median rates, every step a run's start
    from sim.scenario import Acceptance
    from sim.traces import parametric_rates

    task = _bound_choosers(tmp_path, 0.5)["bayes-prefix-task"]
    median = parametric_rates(Acceptance().parametric[Task.MATH], 16)
    for hard, position in (([], 0), ([9], 12), ([9, 30], 43)):
        survival = task.survival([_traced(hard, position, rates)])[0]
        np.testing.assert_allclose(survival, np.cumprod(median), rtol=1e-9)


def test_the_bayes_bound_posterior_finds_the_run_when_the_confidence_tells_it(
    tmp_path: Path,
) -> None:
    """Near-perfect confidence (AUC 0.999): the posterior survival is ~1 before the step's own
    run ends and ~0 after (the run read off the trace, as the oracle reads it), and never rises
    along the block."""
    chooser = _bound_choosers(tmp_path, 0.999)["bayes-bound"]
    requests, truth = _drawn_requests(40, 5, (0.9, 0.6, 0.5))
    survival = chooser.survival(requests)
    assert np.all(np.diff(survival, axis=1) <= 1e-12)
    assert np.abs(survival - truth).mean() < 0.03


def test_the_bayes_bound_posterior_is_calibrated_at_a_trained_pairs_auc(tmp_path: Path) -> None:
    """At AUC 0.78 (the trained pair's) the posterior is calibrated: in each band of predicted
    survival the share of slots that survive matches the mean prediction (a likelihood weighed
    wrong, too strong or too weak, misses in the outer bands)."""
    chooser = _bound_choosers(tmp_path, 0.78)["bayes-bound"]
    requests, drawn = _drawn_requests(600, 11, (0.85, 0.6, 0.6))
    survival, truth = chooser.survival(requests).ravel(), drawn.ravel()
    for low, high in ((0.0, 0.1), (0.1, 0.3), (0.3, 0.7), (0.7, 0.9), (0.9, 1.0)):
        band = (survival >= low) & (survival < high if high < 1 else survival <= 1)
        assert band.sum() > 200, (low, high)
        assert abs(truth[band].mean() - survival[band].mean()) < 0.04, (low, high)


def test_the_prefix_posterior_reads_no_later_position_and_the_joint_one_does() -> None:
    """``run_posterior``: with ``joint`` off, position j's survival depends on the confidence
    of positions 1..j only (a late position changed leaves the earlier ones as they were);
    with it on, a confident late position raises the earlier ones (survival is a prefix).
    Without information (every ratio 0) both are the prior."""
    from sim.ragged_choosers import run_posterior

    prior = np.concatenate(([1.0], np.cumprod(np.full(15, 0.8))))[None, :]
    llr = np.zeros((1, 15))
    for joint in (True, False):
        np.testing.assert_allclose(run_posterior(prior, llr, joint)[0], prior[0, 1:])
    llr[0, :5] = [1.0, -0.5, 0.3, 2.0, -1.0]
    later = llr.copy()
    later[0, 10] = 6.0
    prefix, prefix_later = run_posterior(prior, llr, False), run_posterior(prior, later, False)
    np.testing.assert_allclose(prefix[0, :10], prefix_later[0, :10])
    assert np.all(np.diff(prefix_later[0]) <= 1e-12)
    joint, joint_later = run_posterior(prior, llr, True), run_posterior(prior, later, True)
    assert np.all(joint_later[0, :10] > joint[0, :10])
