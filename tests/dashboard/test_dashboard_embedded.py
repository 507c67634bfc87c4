"""The dashboard on ``draftctl serve`` with the embedded default backend (the `make serve` setup).

Runs the repository's demo model pair (models/demo) on CPU behind a real daemon with the
default policy (goodput, priced by the engine's start-up cost profile), sends greedy streamed
traffic for every task, and checks the page in headless Chromium: per-task requests and
chosen-k bars, k over time and why k is what it is now, a measured step-time speedup on every
task's card (the same method for all three), TPOT, the embedded row with per-request k and
per-position acceptance, each exactly as /api/stats reports it. The screenshot is README's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from playwright.sync_api import expect

from tests.dashboard.daemon import (
    LoopThread,
    get_json,
    js_fixed,
    start_daemon,
    traffic,
    wait_ready,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"
NUM_PER_TASK = 8


@pytest.fixture
def embedded_daemon(tmp_path: Path) -> Iterator[tuple[str, LoopThread]]:
    if not (DEMO / "target" / "config.json").exists():
        pytest.skip(f"demo model pair not found in {DEMO}")
    pytest.importorskip("torch")
    backend = {
        "name": "embedded",
        "kind": "embedded",
        "model": "demo",
        "target": str(DEMO / "target"),
        "draft": str(DEMO / "draft"),
        "device": "cpu",
        "max_batch_size": 4,
        "max_seq_len": 512,
    }
    config = {
        "server": {"host": "127.0.0.1", "port": 0, "drain_timeout_s": 2},
        "policy": {"path": "policy.yaml", "versions_dir": "versions"},
        "backends": [backend],
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc, base = start_daemon(tmp_path / "config.yaml")
    loops = LoopThread()
    try:
        wait_ready(base, timeout_s=60)
        yield base, loops
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        loops.close()


def test_js_fixed_rounds_ties_up_as_javascript_does() -> None:
    assert [js_fixed(v) for v in (2.125, 2.124, 2.0, 0.005, 1.005)] == [
        "2.13", "2.12", "2.00", "0.01", "1.00"  # (1.005 is 1.00499999... as a float)
    ]  # fmt: skip


def test_dashboard_on_the_embedded_default(
    page: Any, embedded_daemon: tuple[str, LoopThread], screenshot: Any
) -> None:
    base, loops = embedded_daemon
    for task in ("math", "code", "chat"):
        served = loops.run(traffic(base, task, NUM_PER_TASK, 2, max_tokens=24, temperature=0))
        assert set(served) == {"embedded"}

    page.goto(f"{base}/dashboard?interval_ms=500")
    page.wait_for_selector("#conn-status.ok")
    stats = get_json(f"{base}/api/stats")
    assert stats["policy"]["kind"] == "goodput"  # the default
    for task in ("math", "code", "chat"):
        card = page.locator(f"#task-{task}")
        data = stats["tasks"][task]
        expect(card.locator(".requests .value")).to_have_text(str(NUM_PER_TASK))
        num_ks = len(data["spec_tokens_chosen"])
        expect(card.locator(".k-chart rect.bar")).to_have_count(num_ks)
        speedup = data["speedup"]
        assert speedup["method"] == "step-times", (task, speedup)  # every card the same way
        expect(card.locator(".speedup .value")).to_have_text(
            re.compile(f"^{js_fixed(speedup['value'])}×")
        )
        assert data["tpot_p50_s"] is not None
        expect(card.locator(".tpot-p50 .value")).not_to_have_text("–")
        assert len(data["k_history"]) == NUM_PER_TASK
        expect(card.locator(".k-history svg polyline")).to_have_count(1)
        expect(card.locator(".k-history svg")).to_have_attribute("data-points", str(NUM_PER_TASK))
        assert data["k_reason"], data
        expect(card.locator(".k-reason")).to_have_text(f"Why k now: {data['k_reason']}")
    row = page.locator('#pools tr[data-pool="embedded"]')
    expect(row.locator("td").nth(1)).to_have_text("embedded")
    expect(row.locator(".health")).to_have_text("● up")
    expect(row.locator("td").nth(5)).to_have_text("per request")
    rates = stats["backends"][0]["accept_rate_per_position"]
    expect(row.locator("rect.bar")).to_have_count(len(rates))
    expect(page.locator("#policy-version")).to_have_text("v1")
    screenshot(page, "embedded-default")
    assert page.watch.errors == [], page.watch.errors
