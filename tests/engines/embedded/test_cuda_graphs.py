"""Graph set-up bookkeeping: warm-up counts and the per-stage seconds a runner reports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.embedded.cuda_graphs import StaticCall, setup_seconds
from engines.embedded.loader import load_runner


def test_setup_seconds_sums_each_stage_and_skips_calls_without_a_graph() -> None:
    def double(x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    calls = [StaticCall(double, (torch.zeros(2),)) for _ in range(3)]
    assert setup_seconds(calls) == {}
    calls[0].setup_s = {"warmup": 0.5, "record": 1.0}
    calls[2].setup_s = {"warmup": 0.25, "end": 2.0}
    assert setup_seconds(calls) == {"warmup": 0.75, "record": 1.0, "end": 2.0}
    assert calls[1](torch.ones(2)).tolist() == [2.0, 2.0]  # the static path still runs


def test_a_runner_refuses_fewer_than_one_warmup(tiny_pair: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="graph_warmups=0: at least 1"):
        load_runner(*tiny_pair, torch.device("cpu"), 2, 64, use_cuda_graphs=True, graph_warmups=0)


def test_a_graph_runner_reports_its_kinds_of_graphs_and_steps(
    tiny_pair: tuple[Path, Path],
) -> None:
    """On the CPU the static calls have no graph, so every kind reports no stage seconds; the
    setting is kept and the runner's graphs run."""
    runner = load_runner(
        *tiny_pair,
        torch.device("cpu"),
        2,
        64,
        use_cuda_graphs=True,
        verify_mode="ragged",
        graph_warmups=1,
    )
    assert runner.graph_warmups == 1
    assert runner.capture_stages_s == {"padded": {}, "prefill": {}, "ragged": {}}
    ids = torch.zeros(2, 1, dtype=torch.long)
    positions = torch.zeros(2, 1, dtype=torch.long)
    assert runner._run("verify", ids, positions).shape[:2] == (2, 1)
