"""The batch-size schedule baseline decides what `draftctl policy export-schedule` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.cli import main
from policies.baselines.fixed import FixedStep
from policies.baselines.schedule import BatchSizeSchedule
from policies.costmodel import CostModel, CostTable
from policies.model import GoodputSpec
from policies.types import TASKS, Task

TABLE = {
    "shape": "test",
    "unit": "s",
    "batch_sizes": [1, 8, 64],
    "tokens_per_request": [1, 8, 16],
    "step_time_s": [[5.5e-3, 6.0e-3, 6.5e-3], [5.8e-3, 7.4e-3, 9.2e-3], [7.8e-3, 26.8e-3, 39e-3]],
}


@pytest.mark.parametrize(
    ("batch", "expected"), [(0, 0), (1, 15), (4, 15), (5, 7), (16, 7), (17, 0), (64, 0), (500, 0)]
)
def test_k_comes_from_the_range_holding_the_batch_size(batch: int, expected: int) -> None:
    schedule = BatchSizeSchedule.from_lists([[1, 4, 15], [5, 16, 7], [17, 64, 0]])
    assert schedule.decide_step([], batch).spec_tokens == expected


@pytest.mark.parametrize(("batch", "expected"), [(3, 11), (6, 11), (9, 4), (100, 4)])
def test_gaps_take_the_range_before_them_and_k_is_capped_like_vllm(
    batch: int, expected: int
) -> None:
    schedule = BatchSizeSchedule.from_lists([[1, 4, 15], [8, 10, 4]], max_spec_tokens=11)
    assert schedule.spec_tokens_for(batch) == expected


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([], "at least one"),
        ([[2, 4, 7]], "start at batch 1"),
        ([[1, 4, 7], [4, 9, 4]], "overlap"),
        ([[1, 4, -1]], "k >= 0"),
    ],
)
def test_malformed_schedules_are_rejected(ranges: list[list[int]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchSizeSchedule.from_lists(ranges)


def test_the_schedule_is_the_one_export_schedule_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cost.json").write_text(json.dumps(TABLE))
    (tmp_path / "policy.yaml").write_text("kind: goodput\ngoodput:\n  cost_table: cost.json\n")
    argv = ["policy", "export-schedule", "--policy", str(tmp_path / "policy.yaml")]
    argv += ["--pool", "p=15", "--max-batch-size", "64", "--mix", "math=1,chat=1"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)["pools"]["p"]
    lists = printed["num_speculative_tokens_per_batch_size"]

    spec = GoodputSpec()
    cost = CostModel(
        CostTable.from_dict(TABLE),
        block_size=16,
        verify_width_multiple=spec.verify_width_multiple,
        draft_cost_fraction=spec.draft_cost_fraction,
    ).snapshot()
    rates = {t: spec.prior_for(t, 15) for t in TASKS}
    mix = {Task.MATH: 1.0, Task.CHAT: 1.0}
    built = BatchSizeSchedule.from_acceptance(rates, mix, cost, 4, 15, 64)
    loaded = BatchSizeSchedule.from_lists(lists)
    assert [r.as_list() for r in built.ranges] == lists
    assert len({k for _, _, k in lists}) > 1  # the case exercises more than one k
    for batch in range(1, 65):
        assert built.decide_step([], batch) == loaded.decide_step([], batch)


@pytest.mark.parametrize(("k", "name"), [(0, "no-spec"), (7, "static-k7")])
def test_fixed_steps_are_named_like_the_results_file(k: int, name: str) -> None:
    policy = FixedStep(k)
    assert policy.name == name
    assert policy.decide_step([], 64).spec_tokens == k
    with pytest.raises(ValueError, match="spec_tokens"):
        FixedStep(-1)
