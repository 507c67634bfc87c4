"""``draftctl bench`` straight against the real vLLM CPU pools: k = 7 with per-request metrics,
the no-speculation pool as the baseline (small counts; runs before test_server_failure.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.stack import MODEL, REPO_ROOT, Fleet

pytestmark = pytest.mark.vllm


def test_bench_reads_vllm_accept_lengths_and_the_speedup(fleet: Fleet, tmp_path: Path) -> None:
    # The tiny pair's tokenizer is byte-level and the servers take 512 tokens: short prompts,
    # from a file of the user's own (jsonl:PATH).
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Say a"}\n{"messages": [{"role": "user", "content": "aaa"}]}\n')
    argv = [
        sys.executable, "-m", "controller.cli", "bench", "--url", fleet.k7_url,
        "--baseline-url", fleet.nospec_url, "--model", MODEL, "--datasets", f"jsonl:{prompts}",
        "--concurrency", "1,2", "--requests", "2", "--max-tokens", "16",
        "--out", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert [(r["policy"], r["concurrency"]) for r in runs] == [
        ("baseline", 1), ("baseline", 2), ("served", 1), ("served", 2)
    ]  # fmt: skip
    for row in runs:
        assert row["errors"] == 0, row["first_error"]
        assert row["output_tok_s"] > 0
        if row["policy"] == "served":  # vLLM's metrics.speculative_decoding, k = 7
            assert 1.0 <= row["mean_accept_length"] <= 8.0
            assert row["speedup"] > 0
        else:
            assert row["mean_accept_length"] is None
