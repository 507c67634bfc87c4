"""bench/plain_step_trace.py's CPU smoke: a tiny engine's plain steps timed and traced, the
host operators summarised per step (the GPU run says where a plain step's time goes outside
its graph)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from bench.plain_step_trace import main


def test_the_smoke_run_summarises_the_host_operators_per_step(tmp_path: Path) -> None:
    out, trace = tmp_path / "t.json", tmp_path / "t.json.gz"
    args = ["--tiny", "--device", "cpu", "--steps", "3", "--warmup", "2", "--top", "5"]
    assert main([*args, "--out", str(out), "--trace", str(trace)]) == 0
    report = json.loads(out.read_text())
    assert report["batch"] == 1 and report["steps"] == 3 and report["shape"] == "tiny"
    assert report["runner"]["cuda_graphs"] is True
    assert len(report["host_ops"]) == 5
    assert all(op["calls_per_step"] > 0 for op in report["host_ops"])
    ordered = [op["self_cpu_us_per_step"] for op in report["host_ops"]]
    assert ordered == sorted(ordered, reverse=True)
    assert 0 < report["wall_ms"]["min"] <= report["wall_ms"]["median"] <= report["wall_ms"]["max"]
    assert report["device_idle_ms"] is None  # no device activity on the CPU
    assert "traceEvents" in json.loads(gzip.decompress(trace.read_bytes()))
    bursts = report["bursts"]  # the default lengths, 5 rounds each in shuffled orders
    assert sorted(bursts["orders"][0]) == ["1", "4", "8"] and len(bursts["orders"]) == 5
    for burst in ("1", "4", "8"):
        cell = bursts[burst]
        assert len(cell["ms_per_step"]) == 5 and all(v > 0 for v in cell["ms_per_step"])
        assert cell["min"] <= cell["mean"] <= cell["max"]
        assert "ratio_to_floor" not in cell  # no floor on the CPU


def _prefilled(tmp_path: Path, *options: str) -> tuple[Any, Any]:
    """plain_step_trace's tiny CPU engine and arguments, its requests added and prefilled."""
    from bench import plain_step_trace

    argv = ["--tiny", "--device", "cpu", *options, "--out", str(tmp_path / "t.json")]
    args = plain_step_trace.parse_args(argv)
    engine, shape = plain_step_trace.build_engine(args)
    plain_step_trace.add_requests(engine, shape, args)
    engine.step()  # the prefills
    return engine, args


def test_bursts_are_timed_per_plain_step(tmp_path: Path) -> None:
    """Each round times at least --steps plain steps of the burst length under test: the
    engine ran bursts of exactly that length (a call's steps counted per row)."""
    from bench import plain_step_trace

    engine, args = _prefilled(
        tmp_path, "--batch", "2", "--steps", "6", "--bursts", "3", "--rounds", "2"
    )
    seen: list[int] = []
    plain_steps = engine.runner.plain_steps

    def counted(rows, uniforms, overlap=None):  # type: ignore[no-untyped-def]
        seen.append(int(uniforms.shape[0]))
        return plain_steps(rows, uniforms, overlap=overlap)

    engine.runner.plain_steps = counted
    before = len(engine.scheduler.running[0].output_ids)
    result = plain_step_trace.compare_bursts(engine, args, lambda: None, None)
    assert set(seen) == {3}
    # Per round: one settling burst, then 6 steps = 2 bursts.
    assert len(engine.scheduler.running[0].output_ids) - before == 2 * (3 + 6)
    assert result["orders"] == [["3"], ["3"]] and len(result["3"]["ms_per_step"]) == 2
    assert engine.plain_burst == 1


def test_burst_graph_rounds_replay_the_burst_graphs_and_the_others_do_not(tmp_path: Path) -> None:
    """``--burst-graph 3``: the runner holds plain-burst graphs of 3 steps; the rounds of
    ``3g`` replay them (one replay per burst), those of 3 and 1 never do."""
    from bench import plain_step_trace

    engine, args = _prefilled(
        tmp_path,
        "--batch",
        "2",
        "--steps",
        "6",
        "--bursts",
        "1,3",
        "--rounds",
        "4",
        "--burst-graph",
        "3",
    )
    call = engine.runner._graphs["stash_burst", 2, 3]
    fn, replays = call.fn, []

    def counting(*inputs):  # type: ignore[no-untyped-def]
        replays.append(engine.runner.burst_graphs)
        return fn(*inputs)

    call.fn = counting
    result = plain_step_trace.compare_bursts(engine, args, lambda: None, None)
    assert sorted(result["orders"][0]) == ["1", "3", "3g"]
    # Four rounds: the requests' room counts the 3g rounds' tokens too (it did not: they ran
    # out of tokens mid-run on the GPU, session 41).
    assert len(result["3g"]["ms_per_step"]) == 4
    # Per 3g round: one settling burst, then 6 steps = 2 bursts; always with the graphs on.
    assert len(replays) == 4 * 3 and all(replays)
    with pytest.raises(SystemExit):
        plain_step_trace.parse_args(["--out", "x", "--burst-graph", "3", "--k", "2"])
    # Each 3g round's settling burst and steps are in the requests' room, as a 3's are.
    without = plain_step_trace.parse_args(
        ["--out", "x", "--steps", "6", "--bursts", "1,3", "--rounds", "4"]
    )
    assert plain_step_trace.new_tokens(args) - plain_step_trace.new_tokens(without) == 4 * (
        6 + 2 * 3
    )


def test_drafting_bursts_are_timed_at_k(tmp_path: Path) -> None:
    """``--k 3``: every row drafts 3 a step, and the compared bursts are drafting bursts."""
    from bench import plain_step_trace

    engine, args = _prefilled(
        tmp_path, "--steps", "4", "--bursts", "1,2", "--rounds", "2", "--k", "3"
    )
    seen: list[int] = []
    spec_steps = engine.runner.spec_steps

    def counted(rows, spec_tokens, uniforms, overlap=None):  # type: ignore[no-untyped-def]
        assert spec_tokens == [3]
        seen.append(int(uniforms.shape[0]))
        return spec_steps(rows, spec_tokens, uniforms, overlap=overlap)

    engine.runner.spec_steps = counted
    result = plain_step_trace.compare_bursts(engine, args, lambda: None, None)
    assert set(seen) == {2} and len(result["2"]["ms_per_step"]) == 2
    assert engine.spec_burst == engine.plain_burst == 1
    assert (
        main(
            [
                "--tiny",
                "--device",
                "cpu",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--k",
                "3",
                "--bursts",
                "1,2",
                "--rounds",
                "1",
                "--out",
                str(tmp_path / "k.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "k.json").read_text())["k"] == 3


def test_the_full_shape_is_refused_on_the_cpu(tmp_path: Path) -> None:
    assert main(["--device", "cpu", "--out", str(tmp_path / "t.json")]) == 2
    with pytest.raises(SystemExit):
        main(["--tiny", "--device", "cpu", "--steps", "0", "--out", str(tmp_path / "t.json")])
    with pytest.raises(SystemExit):
        main(["--tiny", "--device", "cpu", "--k", "16", "--out", str(tmp_path / "t.json")])
    for bad in ("0", "17", "4,x"):
        with pytest.raises(SystemExit):
            main(["--tiny", "--device", "cpu", "--bursts", bad, "--out", str(tmp_path / "t.json")])


def test_chained_bursts_are_compared_beside_the_others(tmp_path: Path) -> None:
    """``--chain``: each burst length above 1 also chained (label ``Nc``), in the same
    shuffled rounds; the engine is left unchained; drafting steps refuse it."""
    from bench import plain_step_trace

    out = tmp_path / "chain.json"
    args = ["--tiny", "--device", "cpu", "--steps", "4", "--warmup", "2", "--rounds", "2"]
    assert main([*args, "--bursts", "1,4", "--chain", "--out", str(out)]) == 0
    bursts = json.loads(out.read_text())["bursts"]
    assert sorted(bursts["orders"][0]) == ["1", "4", "4c"]
    assert len(bursts["4c"]["ms_per_step"]) == 2 and bursts["4c"]["mean"] > 0
    with pytest.raises(SystemExit):
        plain_step_trace.parse_args(["--k", "3", "--chain", "--out", str(out)])
