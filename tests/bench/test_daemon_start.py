"""bench/daemon_start.py on the CPU: a real ``draftctl serve`` of the demo pair started on
fresh caches, asked the three prompts, stopped, restarted on the caches the first start left
(what the CPU can run: the eager variant; the compiled one needs CUDA)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.daemon_start import differences, main, parse_args


def test_a_first_start_and_its_restart_answer_alike(tmp_path: Path) -> None:
    out = tmp_path / "daemon_start.json"
    argv = ["--device", "cpu", "--variants", "eager", "--max-tokens", "4", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert [(r["variant"], r["kind"]) for r in runs] == [("eager", "first"), ("eager", "restart")]
    for run in runs:
        assert run["exit_code"] == 0 and run["ready_s"] > 0
        assert [r["status"] for rounds in run["requests"] for r in rounds] == [200] * 6
    assert result["differences"] == {"eager": 0}  # greedy: the same text every time
    # The restart read the cost table the first start profiled.
    assert any("profiled in" in line for line in runs[0]["log"])
    assert any("step costs (cached" in line for line in runs[1]["log"])
    assert set(result["ready_s"]) == {"eager first", "eager restart"}
    # Where each start's time went: kept lines at their seconds after the launch, in order,
    # from the engine's imports to the listening socket. Every line before the last comes
    # before ready; the last ("listening on") is logged once the socket already accepts (and
    # after a full GC and freeze), so a /readyz answered first can put ready a little ahead
    # of it (3.67 s against its 3.68 in one CI run).
    for run in runs:
        offsets = [at for at, _ in run["stages"]]
        lines = [line for _, line in run["stages"]]
        assert offsets == sorted(offsets) and 0 < offsets[0]
        assert offsets[-2] <= run["ready_s"] and offsets[-1] <= run["ready_s"] + 0.5
        assert "engine modules imported in" in lines[0] and "listening on" in lines[-1]


def test_differences_count_answers_unlike_the_first_eager_ones() -> None:
    def run(variant: str, texts: list[str]) -> dict[str, object]:
        rounds = [{"task": t, "text": x} for t, x in zip(["math", "chat"], texts, strict=True)]
        return {"variant": variant, "requests": [rounds, rounds]}

    runs = [run("compiled", ["a", "B"]), run("eager", ["a", "b"]), run("eager", ["a", "b"])]
    assert differences(runs) == {"compiled": 2, "eager": 0}  # chat differs in both rounds


def test_bad_arguments_are_refused() -> None:
    for argv in (
        ["--variants", "fast"],
        ["--device", "cpu", "--variants", "compiled"],
        ["--repeats", "0"],
    ):
        with pytest.raises(SystemExit):
            parse_args(["--out", "x", *argv])
