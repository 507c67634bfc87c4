"""The simulator end to end on a small scenario, and its CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.cli import main
from policies.validation import InvalidDocument
from sim.runner import run_scenario
from sim.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.fixture(scope="module")
def report() -> dict:  # type: ignore[type-arg]
    return run_scenario(load_scenario(SCENARIOS / "ci-small.yaml"))


def test_every_policy_runs_on_every_phase(report: dict) -> None:  # type: ignore[type-arg]
    assert set(report["policies"]) == {
        "no-spec",
        "static-k7",
        "static-k15",
        "goodput",
        "informed",
        "oracle",
    }
    for result in report["policies"].values():
        assert set(result["phases"]) == {"c1-math", "c32-chat"}
        assert result["goodput_tok_s"] > 0
    assert report["acceptance_source"].startswith("parametric")


def test_no_spec_never_drafts_and_speculation_helps_math_at_batch_1(report: dict) -> None:  # type: ignore[type-arg]
    policies = report["policies"]
    assert policies["no-spec"]["phases"]["c1-math"]["mean_spec_tokens"] == 0
    no_spec = policies["no-spec"]["phases"]["c1-math"]["goodput_tok_s"]
    # A plain batch-1 step is ~5.5 ms: under 200 tokens/s; math drafting gains several x.
    assert 150 < no_spec < 200
    assert policies["static-k15"]["phases"]["c1-math"]["goodput_tok_s"] > 3 * no_spec


def test_goodput_adapts_and_the_oracle_bounds_it(report: dict) -> None:  # type: ignore[type-arg]
    policies = report["policies"]
    phases = policies["goodput"]["phases"]
    # Cheap wide verify at batch 1 -> near full block; busy chat batch -> much smaller k.
    assert phases["c1-math"]["mean_spec_tokens"] > 12
    assert phases["c32-chat"]["mean_spec_tokens"] < phases["c1-math"]["mean_spec_tokens"] / 2
    for name in ("no-spec", "static-k7", "static-k15", "goodput", "informed"):
        assert policies["oracle"]["goodput_tok_s"] >= policies[name]["goodput_tok_s"]
    # Learning online from priors costs little against knowing every request's true rates.
    assert policies["goodput"]["goodput_tok_s"] >= 0.95 * policies["informed"]["goodput_tok_s"]
    assert report["summary"]["vs_no_spec"] >= 0.98


def test_cli_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "simulate",
            "--scenario",
            str(SCENARIOS / "ci-small.yaml"),
            "--json",
            "--plot",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policies"]["goodput"]["goodput_tok_s"] > 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "ci-small-phases.png",
        "ci-small-timeline.png",
    ]


def test_bad_scenario_names_key_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nphases:\n  - {name: a, duration_s: 1, concurrency: 0, mix: {math: 1}}\n"
    )
    with pytest.raises(InvalidDocument, match=r"phases\.0\.concurrency.*line 3"):
        load_scenario(bad)
    assert main(["simulate", "--scenario", str(bad), "--no-progress"]) == 2
    assert main(["simulate", "--scenario", str(tmp_path / "missing.yaml")]) == 2


def test_every_committed_scenario_loads() -> None:
    """The scenario files the results in results/sim/ come from parse and validate (the
    kmin1 variant of issue 16 lowers the policies' minimum k and changes nothing else)."""
    names = sorted(p.stem for p in SCENARIOS.glob("*.yaml"))
    assert names
    for name in names:
        load_scenario(SCENARIOS / f"{name}.yaml")
    base = load_scenario(SCENARIOS / "mixed-shift-ragged-8b-device.yaml")
    kmin1 = load_scenario(SCENARIOS / "mixed-shift-ragged-8b-device-kmin1.yaml")
    assert (base.policies.min_spec_tokens, kmin1.policies.min_spec_tokens) == (4, 1)
    assert kmin1.cost == base.cost and kmin1.phases == base.phases
    # the drain variant (session 53) turns the batch planner's drain rule on, nothing else
    drain = load_scenario(SCENARIOS / "mixed-shift-ragged-8b-device-drain.yaml")
    assert drain.policies.goodput.drain_makespan and not base.policies.goodput.drain_makespan
    unchanged = drain.policies.goodput.model_copy(update={"drain_makespan": False})
    assert unchanged == base.policies.goodput and drain.cost == base.cost
    # the bound variant (session 57) adds the non-clairvoyant bound, nothing else
    bound = load_scenario(SCENARIOS / "mixed-shift-ragged-8b-device-bound.yaml")
    assert bound.policies.include_bayes_bound and not base.policies.include_bayes_bound
    assert bound.policies.model_copy(update={"include_bayes_bound": False}) == base.policies
    assert (bound.cost, bound.phases, bound.acceptance) == (base.cost, base.phases, base.acceptance)
