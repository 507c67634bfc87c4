"""bench/sim_scoring.py: the allocator and vLLM's estimator ranking the simulator's own steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sim_scoring import Tally, main, run

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def _scenario(tmp_path: Path, policies: str) -> Path:
    """scenarios/ci-small.yaml (its cost table found from here), ragged-reading policies."""
    text = (SCENARIOS / "ci-small.yaml").read_text()
    text = text.replace("table: cost/", f"table: {SCENARIOS}/cost/")
    path = tmp_path / "scenario.yaml"
    path.write_text(text + policies + "acceptance:\n  confidence_auc: 0.82\n")
    return path


def test_a_tally_counts_each_policys_best_slots_against_the_truth() -> None:
    import numpy as np

    survive = np.array([[True, True, False], [True, False, False]])
    good = np.array([[0.9, 0.8, 0.1], [0.7, 0.2, 0.1]])  # ranks the survivors first
    bad = good[:, ::-1].copy()
    tally = Tally([1])
    tally.add(survive, {"allocator": good, "vllm-av": bad}, 2, ["math", "chat"])
    out = tally.summary()
    assert out["steps"] == 1 and out["true_survivors_per_step"] == 3
    assert out["budgets"]["oracle"]["allocator"] == 3 and out["budgets"]["oracle"]["vllm-av"] < 3
    assert out["budgets"]["driver"]["allocator"] == 2 and out["budgets"]["1"]["allocator"] == 1
    assert out["row_share_by_task"] == {"chat": 0.5, "math": 0.5}


@pytest.mark.parametrize("driver", ["allocator", "vllm-av"])
def test_either_policy_drives_and_the_other_scores_the_same_steps(
    tmp_path: Path, driver: str
) -> None:
    path = _scenario(tmp_path, "  include_allocator: true\n  include_vllm_av: true\n")
    out = run(path, driver, 8, [40])
    assert out["steps"] > 10 and out["driver"] == driver
    assert out["row_share_by_task"]["chat"] > 0.9  # the busy phase is chat (math carried over)
    oracle = out["budgets"]["oracle"]
    for name in ("allocator", "vllm-av"):
        # at the true survivors' count no ranking beats the truth
        assert 0 < oracle[name] <= out["true_survivors_per_step"] + 1e-9
    assert oracle["allocator_over_vllm"] == pytest.approx(
        oracle["allocator"] / oracle["vllm-av"], abs=1e-3
    )


def test_the_cli_writes_json_and_refuses_a_scenario_without_both_policies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _scenario(tmp_path, "  include_allocator: true\n  include_vllm_av: true\n")
    out = tmp_path / "out.json"
    assert main(["--scenario", str(path), "--min-rows", "8", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python bench/sim_scoring.py") and record["steps"] > 0
    capsys.readouterr()
    lacking = _scenario(tmp_path, "  include_allocator: true\n")
    assert main(["--scenario", str(lacking)]) == 2
    assert "builds no vllm-av" in capsys.readouterr().err
