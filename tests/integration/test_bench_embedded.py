"""``draftctl bench`` against a real daemon with the embedded demo pair on CPU, recording on;
then ``draftctl simulate --replay`` and ``POST /admin/policy/whatif`` on what it recorded.

Small counts (a few requests of 16 tokens per cell): this checks that the pieces work end to
end and report sane figures, not performance.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import Process, free_port, start, wait_ready
from tests.robustness.daemon import embedded_backend

REPO = Path(__file__).resolve().parents[2]
ROW_KEYS = {
    "dataset", "concurrency", "policy", "requests", "output_tok_s", "ttft_ms", "tpot_ms",
    "mean_accept_length",
}  # fmt: skip
STATIC_K = "kind: static\nmin_spec_tokens: {lo}\nstatic:\n  concurrency_bands: [8]\n  spec_tokens:\n    math: [{k}, {k}]\n    code: [{k}, {k}]\n    chat: [{k}, {k}]\n"  # noqa: E501


def _policy(k: int) -> str:
    return STATIC_K.format(k=k, lo=min(4, k) if k else 4)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Process]]:
    folder = tmp_path_factory.mktemp("bench-daemon")
    port = free_port()
    (folder / "policy.yaml").write_text(_policy(7))
    config = {
        "server": {"host": "127.0.0.1", "port": port, "drain_grace_s": 0},
        "policy": {"path": "policy.yaml", "versions_dir": "versions"},
        "recording": {"enabled": True, "path": "traces/served.jsonl"},
        "backends": [{**embedded_backend(512), "cost_cache_dir": str(folder / "costs")}],
    }
    (folder / "draftctl.yaml").write_text(json.dumps(config))
    argv = [
        sys.executable,
        "-m",
        "controller.cli",
        "serve",
        "--config",
        str(folder / "draftctl.yaml"),
    ]
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "DRAFTCTL_ADMIN_TOKEN": ""}
    process = start("draftctl", argv, folder, env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready([(process, url + "/readyz")], 180)
        yield url, folder, process
    finally:
        process.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_bench_compares_policies_and_restores_the_original(
    daemon: tuple[str, Path, Process], tmp_path: Path
) -> None:
    url, folder, _ = daemon
    (tmp_path / "k7.yaml").write_text(_policy(7))
    (tmp_path / "k3.yaml").write_text(_policy(3))
    (tmp_path / "off.yaml").write_text(_policy(0))
    before = urllib.request.urlopen(url + "/admin/policy").read().decode()
    result = _cli(
        "bench", "--url", url, "--datasets", "humaneval,mt-bench", "--concurrency", "1,2",
        "--requests", "2", "--max-tokens", "16", "--policies", str(tmp_path / "k7.yaml"),
        str(tmp_path / "k3.yaml"), "--baseline-policy", str(tmp_path / "off.yaml"),
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runs = json.loads((tmp_path / "out" / "bench.json").read_text())["runs"]
    assert len(runs) == 3 * 2 * 2  # policies x data sets x concurrencies
    assert {r["policy"] for r in runs} == {"baseline", "k7", "k3"}
    for row in runs:
        assert ROW_KEYS <= row.keys()
        assert row["requests"] == 2 and row["errors"] == 0
        assert row["output_tok_s"] > 0 and row["ttft_ms"]["p50"] > 0
        assert set(row["tpot_ms"]) == {"p50", "p99"}
        if row["policy"] == "baseline":
            assert row["mean_accept_length"] is None  # drafting off: nothing to report
            assert row["speedup"] == pytest.approx(1.0)
        else:
            assert 1.0 <= row["mean_accept_length"] <= 8.0
            assert row["speedup"] > 0
    assert (tmp_path / "out" / "bench.png").stat().st_size > 0
    assert "k7" in result.stdout and "speedup" in result.stdout
    after = urllib.request.urlopen(url + "/admin/policy").read().decode()
    assert after == before  # the original policy was put back

    # The daemon recorded every request, with no prompt text.
    trace = (folder / "traces" / "served.jsonl").read_text()
    lines = [json.loads(x) for x in trace.splitlines()]
    assert lines[0]["type"] == "engine" and lines[0]["cost_table"] is not None
    served = [x for x in lines if x["type"] == "request"]
    assert len(served) >= 3 * 2 * 2 * 2
    assert "Complete the following Python function" not in trace
    drafted = [x for x in served if x["step_spec_tokens"]]
    assert drafted and all(
        len(x["accept_lengths"]) == len(x["step_spec_tokens"]) == len(x["step_ms"]) for x in drafted
    )
    assert all(x["prompt_tokens"] > 0 and x["output_tokens"] > 0 for x in served)


def test_replay_and_the_admin_whatif(daemon: tuple[str, Path, Process], tmp_path: Path) -> None:
    url, folder, _ = daemon
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "2+2?"}],
                       "max_tokens": 16})  # fmt: skip
    for _ in range(4):
        request = urllib.request.Request(url + "/v1/chat/completions", body.encode(),
                                         {"content-type": "application/json"})  # fmt: skip
        urllib.request.urlopen(request).read()
    (tmp_path / "k3.yaml").write_text(_policy(3))
    time.sleep(0.5)  # lines reach the file from the recorder's thread
    result = _cli("simulate", "--replay", str(folder / "traces" / "served.jsonl"),
                  "--policy", str(tmp_path / "k3.yaml"), "--recorded-policy",
                  str(folder / "policy.yaml"), "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["recorded"]["requests"] >= 4
    assert report["what_if"]["mean_spec_tokens"] <= 3.0
    assert report["recorded_policy_replayed"]["output_tok_s"] > 0
    assert set(report["delta"]) == {"output_tok_s", "tpot_p50", "ttft_p50"}

    request = urllib.request.Request(
        url + "/admin/policy/whatif", _policy(3).encode(), method="POST"
    )
    answer = json.loads(urllib.request.urlopen(request, timeout=150).read())
    assert answer["window_s"] == 3600 and answer["what_if"]["requests"] >= 4
    bad = urllib.request.Request(url + "/admin/policy/whatif", b"kind: nope", method="POST")
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(bad, timeout=150)
    assert failed.value.code == 422
    assert "static" in json.loads(failed.value.read())["error"]["message"]
