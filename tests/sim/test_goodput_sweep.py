"""results/sim/goodput_sweep.py: a goodput key swept over seeds of a scenario, paired."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "results/sim/goodput_sweep.py"


def _sweep(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    old = sys.argv
    sys.argv = [str(SCRIPT), *argv]
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = old
    return json.loads(capsys.readouterr().out)


def test_each_value_runs_every_seed_on_the_same_requests(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _sweep(
        capsys,
        "--key", "plain_step_age",
        "--values", "0,1",
        "--scenarios", "ci-small",
        "--seeds", "3,4",
        "--with-static",
    )  # fmt: skip
    runs = out["runs"]["ci-small"]
    assert set(runs) == {"0.0", "1.0"} and all(set(r) == {"3", "4"} for r in runs.values())
    for per_seed in runs.values():
        for run in per_seed.values():
            assert run["goodput_tok_s"] > 0 and run["best_static_tok_s"] > 0
    # the static policies do not read the key: the same best static k under either value
    assert runs["0.0"]["3"]["best_static_tok_s"] == runs["1.0"]["3"]["best_static_tok_s"]
    spread = out["spread"]["ci-small"]
    assert spread["0.0"]["vs_plain_step_age_0.0"] == {"mean": 1.0, "stdev": 0.0}
    assert out["command"].startswith(".venv/bin/python results/sim/goodput_sweep.py --key")


def test_an_unknown_key_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _sweep(capsys, "--key", "no_such_key", "--values", "1", "--scenarios", "ci-small")
    assert "no key 'no_such_key'" in capsys.readouterr().err
