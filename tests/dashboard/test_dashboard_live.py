"""The dashboard on a real ``draftctl serve`` with real traffic, in headless Chromium.

Two vLLM-shaped fake pools (tests/controller/fake_upstream.py) on loopback stand in for the
fleet: ``vllm-k7`` reports per-request ``metrics.speculative_decoding`` and streams faster,
``vllm-k0`` runs without speculation. The daemon is the real one, started as a subprocess.
The test drives traffic for every task, changes the policy in the page's editor so chat
moves to the no-spec pool, drives more chat traffic, and checks that the page shows what
``/api/stats`` reports: per-task requests, chosen-k bars, a measured chat speedup, pools and
the concurrency chart.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from playwright.sync_api import expect

from tests.controller.fake_upstream import Behaviour, FakeUpstream, vllm_spec_metrics
from tests.dashboard.daemon import (
    MODEL,
    LoopThread,
    get_json,
    js_fixed,
    start_daemon,
    traffic,
    wait_ready,
)
from tests.policy_texts import STATIC_POLICY_TEXT

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHAT_OFF = STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [0, 0, 0, 0]")


def pool(name: str, url: str, k: int) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "vllm",
        "urls": [url],
        "model": MODEL,
        "spec_tokens": k,
        "block_size": 8,
        "health_interval_s": 0.5,
        "timeout_s": 10,
    }


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[str, LoopThread]]:
    loops = LoopThread()
    fast = FakeUpstream(Behaviour(num_chunks=24, chunk_delay_s=0.004, spec=vllm_spec_metrics(7)))
    plain = FakeUpstream(Behaviour(num_chunks=24, chunk_delay_s=0.012))
    urls = [loops.run(fast.start()), loops.run(plain.start())]
    config = {
        "server": {"host": "127.0.0.1", "port": 0, "drain_timeout_s": 2},
        "policy": {"path": "policy.yaml", "versions_dir": "versions", "reload_debounce_s": 0.1},
        "backends": [pool("vllm-k7", urls[0], 7), pool("vllm-k0", urls[1], 0)],
    }
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    (tmp_path / "policy.yaml").write_text(STATIC_POLICY_TEXT)  # the edit below changes its table
    proc, base = start_daemon(config_path)
    try:
        wait_ready(base)
        yield base, loops
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        loops.run(fast.stop())
        loops.run(plain.stop())
        loops.close()


def test_live_dashboard_through_the_daemon(
    page: Any, daemon: tuple[str, LoopThread], screenshot: Any
) -> None:
    base, loops = daemon
    for task in ("math", "code", "chat"):
        assert set(loops.run(traffic(base, task, 12, 4))) == {"vllm-k7"}

    page.goto(f"{base}/dashboard?interval_ms=500")
    page.wait_for_selector("#conn-status.ok")
    for task in ("math", "code", "chat"):
        expect(page.locator(f"#task-{task} .requests .value")).to_have_text("12")
        expect(page.locator(f"#task-{task} .k-chart rect.bar")).to_have_count(1)
    expect(page.locator("#pools tbody tr")).to_have_count(2)
    expect(page.locator('#pools tr[data-pool="vllm-k7"] .health')).to_have_text("● up")

    # Move chat off speculation in the page's editor; the version changes everywhere.
    expect(page.locator("#policy-text")).to_have_value(re.compile("kind: static"))
    page.fill("#policy-text", CHAT_OFF)
    page.click("#btn-apply")
    expect(page.locator("#editor-status")).to_have_text(re.compile("applied: now version 2"))
    expect(page.locator("#policy-version")).to_have_text("v2")

    assert set(loops.run(traffic(base, "chat", 12, 4))) == {"vllm-k0"}
    chat = page.locator("#task-chat")
    expect(chat.locator(".requests .value")).to_have_text("24")
    expect(chat.locator(".k-chart rect.bar")).to_have_count(2)
    expect(chat.locator(".k-chart rect.bar.off")).to_have_count(1)
    expect(chat.locator(".speedup .badge")).to_have_text(re.compile("measured", re.I))
    expect(page.locator("#concurrency-chart polyline")).to_have_count(1)

    stats = get_json(f"{base}/api/stats")
    speedup = stats["tasks"]["chat"]["speedup"]
    assert speedup["method"] == "tpot-vs-no-spec-pool" and speedup["value"] > 1
    # The measured speedup moves as the daemon's windows age between a read here and the
    # page's next poll (2.62 here, 2.63 on the page in one CI run; 2.627 and 2.69 in another):
    # the page shows the daemon's current figure to within 2% once its poll has caught up.
    value = chat.locator(".speedup .value")
    expect(value).to_have_text(re.compile(r"^\d+\.\d{2}×"))
    for _ in range(20):  # each round re-reads both (the page polls every 500 ms)
        shown = float(value.inner_text().split("×")[0])
        current = get_json(f"{base}/api/stats")["tasks"]["chat"]["speedup"]["value"]
        if shown == pytest.approx(current, rel=0.02):
            break
        page.wait_for_timeout(250)
    assert shown == pytest.approx(current, rel=0.02)
    expect(chat.locator(".speedup-method")).to_contain_text("TPOT vs no-spec pool")
    accept = stats["tasks"]["math"]["accept_length_mean"]
    assert accept is not None
    expect(page.locator("#task-math .accept-length .value")).to_have_text(js_fixed(accept))
    page.wait_for_timeout(1500)  # one more poll so the screenshot shows settled charts
    screenshot(page, "live-daemon")
    assert page.watch.errors == [], page.watch.errors
