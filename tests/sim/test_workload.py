"""Requests drawn from recorded traces: prompt lengths, and errors that name the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.scenario import Scenario
from sim.workload import Workload

MIX = {"math": 1}


def _scenario(tmp_path: Path, mix: dict[str, float], traces: str = "t.jsonl") -> Scenario:
    lines = [{"task": "math", "block_size": 8, "accept_lengths": [3, 8, 1]}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return Scenario.model_validate(
        {
            "name": "w",
            "block_size": 8,
            "lengths": {"math": {"prompt_tokens": [300, 310]}},
            "acceptance": {"traces": traces},
            "phases": [{"name": "p", "duration_s": 1, "concurrency": 2, "mix": mix}],
            "base_dir": str(tmp_path),
        }
    )


def test_trace_requests_replay_the_trace_and_draw_a_prompt_length(tmp_path: Path) -> None:
    workload = Workload(_scenario(tmp_path, MIX))
    spec = workload.request(0, 1, 0)
    assert spec.num_output_tokens == 12
    assert 300 <= spec.prompt_tokens <= 310
    assert workload.request(0, 1, 0) is spec  # the same request for every policy
    assert workload.source.startswith("traces t.jsonl (math 1 requests)")


def test_a_missing_trace_file_is_an_error_not_a_silent_fallback(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"acceptance\.traces: .*nope\.jsonl does not exist"):
        Workload(_scenario(tmp_path, MIX, traces="nope.jsonl"))


def test_a_task_without_traces_is_an_error(tmp_path: Path) -> None:
    workload = Workload(_scenario(tmp_path, {"chat": 1}))
    with pytest.raises(ValueError, match="holds no 'chat' requests"):
        workload.request(0, 0, 0)
