"""sim/traffic_log.py and ``draftctl plan --traffic-log``: a served trace described as open-loop
windows of its arrival rate and mix, its drafted requests' acceptance, and clear errors."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from controller.cli import main
from policies.types import Task
from sim.replay import TraceError, acceptance
from sim.scenario import load_scenario
from sim.traffic_log import read_traffic, write_traffic
from sim.workload import Workload
from tests.sim.served_trace import HEADER, TABLE, request_line, write_trace


def _request(t: float, task: str, lengths: list[int], ks: list[int]) -> dict[str, Any]:
    return request_line(t, lengths, ks, task=task, prompt_tokens=30 + int(t) % 7)


def _trace(path: Path, lines: list[dict[str, Any]], header: dict[str, Any] = HEADER) -> Path:
    return write_trace(path, lines, header)


def _two_windows(path: Path) -> Path:
    """10 math requests in the first minute (drafting), 30 chat in the second (20 drafting)."""
    lines = [_request(1000.0 + 6 * i, "math", [8, 3, 5, 1], [7, 7, 7, 7]) for i in range(10)]
    lines += [
        _request(1060.0 + 2 * i, "chat", [2, 1, 4] if i < 20 else [], [7, 7, 3] if i < 20 else [])
        for i in range(30)
    ]
    lines[-1]["t"] = 1120.0  # the newest request exactly at the second window's end
    lines.append({**_request(1030.0, "code", [3], [7]), "error": True})  # failed: not traffic
    return _trace(path, lines)


def test_windows_carry_the_recorded_rate_and_mix(tmp_path: Path) -> None:
    traffic = read_traffic(_two_windows(tmp_path / "served.jsonl"), window_s=60)
    assert [(w.name, w.duration_s, w.num_requests) for w in traffic.windows] == [
        ("w1", 60, 10),
        ("w2", 60, 30),
    ]
    assert traffic.windows[0].mix == {Task.MATH: 1.0}
    assert traffic.windows[1].mix == {Task.CHAT: 1.0}
    # Only the requests that drafted give acceptance; the others still count as arrivals.
    assert len(traffic.requests) == 30
    chat = traffic.summary["tasks"]["chat"]
    assert (chat["requests"], chat["drafted_requests"]) == (30, 20)
    assert chat["max_recorded_k"] == 7 and chat["all_accepted_step_share"] == 0.333
    assert traffic.summary["tasks"]["code"]["requests"] == 0  # the failed one is not traffic


def test_the_newest_seconds_and_a_rate_scale(tmp_path: Path) -> None:
    path = _two_windows(tmp_path / "served.jsonl")
    traffic = read_traffic(path, window_s=30, last_s=60, rate_scale=2.0)
    assert sum(w.num_requests for w in traffic.windows) == 30
    scenario = load_scenario(write_traffic(traffic, tmp_path / "out"))
    assert [p.arrival_rate for p in scenario.phases] == [pytest.approx(30.0 / 30), 1.0]


def test_the_written_scenario_draws_the_recorded_requests(tmp_path: Path) -> None:
    path = _two_windows(tmp_path / "served.jsonl")
    traffic = read_traffic(path, window_s=60)
    scenario = load_scenario(write_traffic(traffic, tmp_path / "out", instances=3))
    assert scenario.fleet is not None and scenario.fleet.instances == 3
    assert scenario.block_size == 8 and scenario.max_batch_size == 8
    wider = write_traffic(traffic, tmp_path / "wide", max_batch_size=256)
    assert load_scenario(wider).max_batch_size == 256
    assert [p.arrival_rate for p in scenario.phases] == [pytest.approx(10 / 60), 0.5]
    assert json.loads((tmp_path / "out" / "traffic-cost.json").read_text()) == TABLE
    recorded = {
        (r.prompt_tokens, r.output_tokens, r.hard_positions): r.task for r in traffic.requests
    }
    math_line = _request(1000.0, "math", [8, 3, 5, 1], [7, 7, 7, 7])
    assert acceptance(math_line, 8).hard_positions in {key[2] for key in recorded}
    workload = Workload(scenario)
    for index in range(20):
        spec = workload.request(1, index, 0)
        key = (spec.prompt_tokens, spec.num_output_tokens, spec.trace.hard_positions)
        assert recorded[key] == spec.task == Task.CHAT


def test_errors_say_what_to_do(tmp_path: Path) -> None:
    no_draft = [_request(1000.0 + i, "chat", [], []) for i in range(3)]
    path = _trace(tmp_path / "a.jsonl", [*no_draft, _request(1003.0, "math", [2], [7])])
    with pytest.raises(TraceError, match=r"chat drafted.*drafting on"):
        write_traffic(read_traffic(path, window_s=60), tmp_path / "a")
    bare = {**HEADER, "cost_table": None}
    path = _trace(tmp_path / "b.jsonl", [_request(1000.0, "math", [2], [7])], bare)
    with pytest.raises(TraceError, match="--cost-table"):
        write_traffic(read_traffic(path, window_s=60), tmp_path / "b")
    with pytest.raises(TraceError, match=r"missing\.json: no such file"):
        write_traffic(read_traffic(path, window_s=60), tmp_path / "b", tmp_path / "missing.json")
    path = _trace(tmp_path / "c.jsonl", [{**_request(1000.0, "math", [2], [7]), "task": "poem"}])
    with pytest.raises(TraceError, match=r"t=1000\.0 is not a served-request line"):
        read_traffic(path, window_s=60)
    with pytest.raises(TraceError, match="no trace file"):
        read_traffic(tmp_path / "missing.jsonl", window_s=60)
    with pytest.raises(TraceError, match="> 0"):
        read_traffic(path, window_s=0)
    with pytest.raises(TraceError, match="longer --window-s"):
        read_traffic(_two_windows(tmp_path / "d.jsonl"), window_s=0.1)


def test_plan_from_a_traffic_log_writes_the_scenario_it_simulated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # (its requests arrive seconds apart: open loop)
    path = _two_windows(tmp_path / "served.jsonl")
    out = tmp_path / "plan"
    argv = ["plan", "--traffic-log", str(path), "--instances", "2", "--window-s", "60",
            "--out-dir", str(out), "--json", "--no-progress", "--search-scale", "0.5"]  # fmt: skip
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["traffic_log"]["requests"] == 40 and plan["traffic_log"]["drafted_requests"] == 30
    assert plan["traffic_log"]["scenario"] == str(out / "traffic.yaml")
    assert plan["recommended"] in plan["full_length"]
    # Open-loop traffic: every fleet that keeps up serves the same tokens, latency decides.
    assert plan["objective"] == "latency" and "search_goodput_tok_s" not in plan
    latency = {n: e["latency_ms_mean"] for n, e in plan["full_length"].items()}
    assert latency[plan["recommended"]] == min(latency.values())
    assert set(plan["search_latency_ms_mean"]) >= set(plan["full_length"])
    for name in ("traffic.yaml", "traffic-acceptance.jsonl", "plan.json", "launch-vllm.sh"):
        assert (out / name).is_file()
    # The written scenario is the traffic the plan simulated: planning from it agrees.
    assert main(["plan", "--traffic", str(out / "traffic.yaml"), "--instances", "2", "--json",
                 "--no-progress", "--search-scale", "0.5"]) == 0  # fmt: skip
    again = json.loads(capsys.readouterr().out)
    assert again["recommended"] == plan["recommended"]
    assert again["full_length"] == plan["full_length"]


def test_plan_refuses_a_log_it_cannot_use(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _trace(tmp_path / "served.jsonl", [_request(1000.0, "chat", [], [])])
    assert main(["plan", "--traffic-log", str(path), "--instances", "2", "--no-progress"]) == 2
    assert "chat drafted" in caplog.text
    assert main(["plan", "--traffic-log", str(path), "--draft-cost-fraction", "2"]) == 2
    assert "--draft-cost-fraction" in caplog.text
    assert main(["plan", "--traffic-log", str(path), "--instances", "0"]) == 2
    assert "--instances must be >= 1" in caplog.text


def test_chained_requests_are_planned_as_clients(tmp_path: Path) -> None:
    """Requests that arrive as another ends (a client sending its next one) make the traffic
    closed-loop under ``loop="auto"``: each window as many clients as requests were in flight
    there on average (x the rate scale), and the plan ranks by goodput; ``loop="open"`` keeps
    arrival rates, and spread-out arrivals stay open under auto."""
    lines = []
    for client in range(3):  # 3 clients, each request 2 s long, the next 0.1 s after
        t = 1000.0 + 0.3 * client
        while t < 1058.0:
            lines.append({**_request(t, "math", [4, 4], [7, 7]), "latency_ms": 2000.0})
            t += 2.1
    path = _trace(tmp_path / "chained.jsonl", lines)
    auto = read_traffic(path, window_s=30, rate_scale=2.0, loop="auto")
    assert auto.closed and auto.summary["loop"] == "closed"
    assert auto.summary["chained_share"] > 0.9
    # 3 clients, busy 2 s of every 2.1: ~2.9 in flight
    assert [2.7 < w.in_flight < 3.0 for w in auto.windows] == [True, True]
    scenario = load_scenario(write_traffic(auto, tmp_path / "closed"))
    assert [p.concurrency for p in scenario.phases] == [6, 6]  # x 2
    assert not read_traffic(path, window_s=30, loop="open").closed
    assert not read_traffic(_two_windows(tmp_path / "open.jsonl"), window_s=60, loop="auto").closed
    # Independent arrivals often come just after some other request's end too: at 4 a second
    # (ends ~4 a second) by chance 63% of them; auto must not take that for clients, and at 40
    # a second it cannot tell (open).
    for rate, basis in ((4.0, "not above chance"), (40.0, "too busy")):
        rng = random.Random(7)
        t, poisson = 1000.0, []
        for _ in range(600):
            t += rng.expovariate(rate)
            latency = rng.uniform(500.0, 3000.0)
            poisson.append({**_request(t, "chat", [2], [7]), "latency_ms": latency})
        traffic = read_traffic(_trace(tmp_path / f"p{rate}.jsonl", poisson), 30, loop="auto")
        assert not traffic.closed and basis in traffic.summary["loop_basis"], traffic.summary
    out = tmp_path / "plan"
    argv = ["plan", "--traffic-log", str(path), "--instances", "2", "--window-s", "30",
            "--out-dir", str(out), "--json", "--no-progress", "--search-scale", "0.5"]  # fmt: skip
    assert main(argv) == 0
    assert "concurrency: 3" in (out / "traffic.yaml").read_text()
