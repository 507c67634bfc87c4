"""The OnlineModels facade the daemon holds, and the schedule export built on it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from controller.cli import main
from engines.cost_tables import goodput_cost_table
from policies.costmodel import CostModel, CostTable
from policies.model import GoodputSpec
from policies.online import OnlineModels
from policies.schedule import build_schedule
from policies.types import Task

TABLE = {
    "shape": "test",
    "unit": "s",
    "batch_sizes": [1, 8, 64],
    "tokens_per_request": [1, 8, 16],
    "step_time_s": [[5.5e-3, 6.0e-3, 6.5e-3], [5.8e-3, 7.4e-3, 9.2e-3], [7.8e-3, 26.8e-3, 39e-3]],
}


def _models(tmp_path: Path) -> OnlineModels:
    (tmp_path / "cost.json").write_text(json.dumps(TABLE))
    spec = GoodputSpec(cost_table="cost.json")
    return OnlineModels(spec, 16, goodput_cost_table(spec, tmp_path))


def test_outcomes_update_the_task_estimate_and_observe_feeds_observations(tmp_path: Path) -> None:
    models = _models(tmp_path)
    before = models.observe(Task.CHAT)["accept_rates"][0]
    for _ in range(50):
        models.record_outcome(Task.CHAT, spec_tokens=7, accept_lengths=[8, 8, 8])
    fields = models.observe(Task.CHAT)
    assert fields["accept_rates"][0] > before
    assert fields["accept_trials"][0] > 100
    assert fields["accept_trials"][8] == 0.0  # never drafted: censored, not failed
    assert models.observe(Task.MATH)["accept_rates"][0] == pytest.approx(0.9)
    assert fields["step_cost"].step_time_s(1, 0) == pytest.approx(5.5e-3)


def test_vllm_style_counts_and_tpot_refine_the_models(tmp_path: Path) -> None:
    models = _models(tmp_path)
    models.record_outcome(
        Task.CODE, spec_tokens=4, num_drafts=1000, accepted_per_position=[100, 50, 25, 12]
    )
    assert models.observe(Task.CODE)["accept_rates"][0] < 0.2
    cost_before = models.observe(Task.CODE)["step_cost"].step_time_s(64, 7)
    for _ in range(200):
        models.record_outcome(
            Task.CODE, spec_tokens=7, accept_lengths=[2], tpot_s=0.05, batch_size=64
        )
    assert models.observe(Task.CODE)["step_cost"].step_time_s(64, 7) > 2 * cost_before
    snapshot = models.to_dict()
    assert len(snapshot["cost_correction"]) == 3
    assert len(snapshot["cost_overhead_s"]) == 3
    # Per batch size row, [ratio, weight] per captured width (1, 8, 16): width 8 seen at 64.
    fits = snapshot["cost_width_fits"]
    assert [len(row) for row in fits] == [3, 3, 3] and fits[2][1][1] > 0.99
    json.dumps(snapshot)
    assert len(snapshot["tasks"]["code"]["accept_rates"]) == 15
    with pytest.raises(ValueError, match="one k per step"):
        models.record_outcome(Task.CODE, spec_tokens=[7, 7], accept_lengths=[1])


def test_schedule_ranges_start_at_one_and_shrink_k_with_load() -> None:
    cost = CostModel(CostTable.from_dict(TABLE), verify_width_multiple=8).snapshot()
    rates = {t: [0.88] * 15 for t in Task}
    ranges = build_schedule(rates, {Task.MATH: 1.0}, cost, 4, 15, 100)
    assert ranges[0].batch_start == 1 and ranges[-1].batch_end == 100
    assert all(a.batch_end + 1 == b.batch_start for a, b in itertools.pairwise(ranges))
    ks = [r.spec_tokens for r in ranges]
    assert ks[0] == 15 and ks == sorted(ks, reverse=True) and 7 in ks
    # A pool started with k = 7 never gets more than 7.
    assert max(r.spec_tokens for r in build_schedule(rates, {Task.MATH: 1}, cost, 4, 7, 100)) == 7


def test_export_schedule_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = _models(tmp_path)
    for _ in range(300):
        models.record_outcome(Task.CHAT, spec_tokens=15, accept_lengths=[1, 1])
    (tmp_path / "models.json").write_text(json.dumps(models.to_dict()))
    (tmp_path / "policy.yaml").write_text("kind: goodput\ngoodput:\n  cost_table: cost.json\n")
    argv = [
        "policy",
        "export-schedule",
        "--policy",
        str(tmp_path / "policy.yaml"),
        "--pool",
        "fast=15",
        "--max-batch-size",
        "64",
    ]
    assert main([*argv, "--mix", "math=1"]) == 0
    math = json.loads(capsys.readouterr().out)["pools"]["fast"]
    assert math["num_speculative_tokens_per_batch_size"][0][:1] == [1]
    assert math["num_speculative_tokens_per_batch_size"][0][2] == 15
    config = json.loads(math["speculative_config"])
    assert config["num_speculative_tokens"] == 15
    # Learned: this fleet's chat drafts are hopeless -> drafting off at every batch size.
    assert main([*argv, "--mix", "chat=1", "--models", str(tmp_path / "models.json")]) == 0
    chat = json.loads(capsys.readouterr().out)["pools"]["fast"]
    assert chat["num_speculative_tokens_per_batch_size"] == [[1, 64, 0]]
    assert main([*argv, "--mix", "poetry=1"]) == 2
    assert main(["policy", "export-schedule"]) == 2


def test_export_schedule_counts_the_policy_files_host_overhead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step's fixed host time weighs on plain and drafting steps alike, so it makes drafting
    pay at larger batches: chat stops drafting at batch 40 without it and never with 50 ms."""
    (tmp_path / "cost.json").write_text(json.dumps(TABLE))
    schedules = []
    for extra in ("", "  step_overhead_s: 0.05\n"):
        policy = "kind: goodput\ngoodput:\n  cost_table: cost.json\n" + extra
        (tmp_path / "policy.yaml").write_text(policy)
        argv = ["policy", "export-schedule", "--policy", str(tmp_path / "policy.yaml")]
        assert main([*argv, "--pool", "fast=15", "--max-batch-size", "64", "--mix", "chat=1"]) == 0
        pool = json.loads(capsys.readouterr().out)["pools"]["fast"]
        schedules.append(pool["num_speculative_tokens_per_batch_size"])
    assert schedules[0][-1] == [40, 64, 0]
    assert all(k > 0 for _, _, k in schedules[1])


def test_policy_file_host_overhead_reaches_the_cost_model(tmp_path: Path) -> None:
    from policies.model import parse_policy
    from policies.validation import InvalidDocument

    (tmp_path / "cost.json").write_text(json.dumps(TABLE))
    text = "kind: goodput\ngoodput:\n  cost_table: cost.json\n  step_overhead_s: 0.002\n"
    spec = parse_policy(text + "  request_overhead_s: 0.0001\n").goodput
    cost = OnlineModels(spec, 16, goodput_cost_table(spec, tmp_path)).step_cost()
    assert cost is not None
    assert cost.step_time_s(1, 0) == pytest.approx(5.5e-3 + 0.002 + 0.0001)
    with pytest.raises(InvalidDocument, match=r"goodput\.step_overhead_s"):
        parse_policy(text.replace("0.002", "-1"))
