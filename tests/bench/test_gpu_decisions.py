"""The GPU-decisions harness on the CPU (tiny random model): every policy runs, the results
file has the shape other checks read (issue #13), and every policy serves the same requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.gpu_decisions import main

POLICIES = "no-spec,static-k7,dsd-schedule,vllm-av,goodput,oracle"


@pytest.fixture(scope="module")
def arm_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu") / "synthetic-tiny.json"
    argv = [
        "--arm",
        "synthetic-tiny",
        "--device",
        "cpu",
        "--scale",
        "0.04",
        "--repeats",
        "1",
        "--policies",
        POLICIES,
        "--prompt-tokens",
        "8,12",
        "--output-tokens",
        "12,24",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    return out


def test_every_policy_ran_on_the_same_requests(arm_json: Path) -> None:
    report = json.loads(arm_json.read_text())
    runs = {run["policy"]: run for run in report["runs"]}
    assert set(runs) == set(POLICIES.split(","))
    tokens = {name: [p["tokens"] for p in run["phases"].values()] for name, run in runs.items()}
    assert len({tuple(t) for t in tokens.values()}) == 1  # same requests, same token counts
    assert runs["no-spec"]["phases"]["math"]["mean_spec_tokens"] == 0
    assert runs["static-k7"]["phases"]["mixed"]["mean_spec_tokens"] <= 7
    assert report["arm_info"]["synthetic"]["warning"].startswith("SYNTHETIC ACCEPTANCE")


def test_merged_results_file_has_the_documented_shape(arm_json: Path, tmp_path: Path) -> None:
    merged = tmp_path / "gpu_decisions.json"
    assert main(["--merge", str(arm_json), "--out", str(merged)]) == 0
    data = json.loads(merged.read_text())
    assert data["engine"] == "padded" and "command" in data
    policies = data["arms"]["synthetic-tiny"]["policies"]
    for name in POLICIES.split(","):
        cell = policies[name]
        assert {"tok_s_mean", "tok_s_spread", "repeats", "phases"} <= set(cell)
        for phase in ("math", "mixed", "chat"):
            assert {"tok_s_mean", "mean_spec_tokens", "step_ms_mean"} <= set(cell["phases"][phase])
