"""The dashboard in real headless Chromium against the admin API and a sample /api/stats.

The admin API and the policy store are the real ones; /api/stats serves
``sample_stats.json`` (the contract schema, with policy.version following the store) so
these tests pin the page's rendering without a fleet. The live-traffic test through the
daemon is in test_dashboard_live.py.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from controller.admin import AdminAuth, admin_routes
from controller.dashboard import dashboard_routes
from controller.policy.store import PolicyStore
from tests.policy_texts import STATIC_POLICY_TEXT

pytestmark = pytest.mark.browser

SAMPLE = json.loads((Path(__file__).parent / "sample_stats.json").read_text())
BAD_BANDS = STATIC_POLICY_TEXT.replace("[8, 32, 64]", "[8, 64, 32]")
CHAT_OFF = STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [0, 0, 0, 0]")


def sample_app(store: PolicyStore, token: str | None = None) -> Starlette:
    async def api_stats(request: Request) -> JSONResponse:
        now = time.time()
        shift = now - SAMPLE["time_s"]
        history = [[t + shift, n] for t, n in SAMPLE["concurrency"]["history"]]
        policy = {"version": store.current()[0], "kind": store.current()[2].kind}
        tasks = {
            task: {**data, "k_history": [[t + shift, k] for t, k in data["k_history"]]}
            for task, data in SAMPLE["tasks"].items()
        }
        body = {
            **SAMPLE,
            "tasks": tasks,
            "time_s": now,
            "policy": policy,
            "concurrency": {"current": SAMPLE["concurrency"]["current"], "history": history},
        }
        return JSONResponse(body)

    routes = [
        Route("/api/stats", api_stats),
        *admin_routes(store, AdminAuth(token=token)),
        *dashboard_routes(),
    ]
    return Starlette(routes=routes)


@pytest.fixture
def store(tmp_path: Path) -> PolicyStore:
    """Starts from the static table: the editor tests edit it and check its lines."""
    (tmp_path / "policy.yaml").write_text(STATIC_POLICY_TEXT)
    return PolicyStore(tmp_path / "policy.yaml", tmp_path / "versions")


@pytest.fixture
def dashboard(serve_app: Any, store: PolicyStore) -> Iterator[str]:
    with serve_app(sample_app(store)) as base:
        yield base


def resource_status_line(status: int) -> str:
    # Chromium logs every non-2xx fetch like this; the page handles these statuses itself.
    return f"console.error: Failed to load resource: the server responded with a status of {status}"


@contextmanager
def opened(page: Any, url: str, expected_statuses: tuple[int, ...] = ()) -> Iterator[Any]:
    """Open the dashboard; on exit assert no console errors but the expected HTTP statuses."""
    page.goto(url)
    page.wait_for_selector("#conn-status.ok")
    yield page
    expected = tuple(resource_status_line(s) for s in expected_statuses)
    unexpected = (
        [e for e in page.watch.errors if not e.startswith(expected)]
        if expected
        else page.watch.errors
    )
    assert unexpected == [], unexpected


def test_page_renders_stats_with_no_console_errors(
    page: Any, dashboard: str, screenshot: Any
) -> None:
    with opened(page, f"{dashboard}/dashboard?interval_ms=300"):
        page.wait_for_selector("#task-chat .k-chart svg rect.bar")
        # k distribution per task: math chose k=4 and k=7; chat also ran with drafting off
        assert page.locator("#task-math .k-chart rect.bar").count() == 2
        assert page.locator("#task-chat .k-chart rect.bar").count() == 3
        assert page.locator("#task-chat .k-chart rect.bar.off").count() == 1
        math = page.locator("#task-math")
        assert math.locator(".requests .value").inner_text() == "412"
        assert math.locator(".accept-length .value").inner_text() == "5.80"
        assert math.locator(".tpot-p50 .value").inner_text() == "12.1 ms"
        assert math.locator(".tpot-p95 .value").inner_text() == "18.8 ms"
        assert math.locator(".speedup .value").inner_text().startswith("2.41×")
        assert math.locator(".speedup .badge").inner_text().lower() == "measured"
        assert "TPOT vs no-spec pool" in math.locator(".speedup-method").inner_text()
        chat = page.locator("#task-chat")
        assert chat.locator(".speedup .badge").inner_text().lower() == "estimate"
        assert "estimate from the cost model" in chat.locator(".speedup-method").inner_text()
        # concurrency over time: one polyline vertex per sample
        line = page.locator("#concurrency-chart polyline")
        assert len(line.get_attribute("points").split()) == 180
        # pools: health, in flight, k, per-position acceptance bars
        rows = page.locator("#pools tbody tr")
        assert rows.count() == 4
        embedded = page.locator('#pools tr[data-pool="embedded"] td')
        assert embedded.nth(5).inner_text() == "per request"
        assert page.locator('#pools tr[data-pool="embedded"] rect.bar').count() == 15
        code = page.locator("#task-code .speedup-method").inner_text()
        assert code.startswith("Speedup measured from step times: accept length 4.90"), code
        assert page.locator('#pools tr[data-pool="vllm-k0"] .health').inner_text() == "● down"
        k7 = page.locator('#pools tr[data-pool="vllm-k7"] td')
        assert [k7.nth(i).inner_text() for i in (2, 3, 5)] == ["● up", "5", "7"]
        assert page.locator('#pools tr[data-pool="vllm-k7"] rect.bar').count() == 7
        assert page.locator("#policy-version").inner_text() == "v1"
        expect(page.locator("#policy-text")).to_have_value(re.compile("kind: static"))
        # k over time and why k is what it is now
        assert page.locator("#task-math .k-history svg").get_attribute("data-points") == "10"
        assert page.locator("#task-chat .k-history svg polyline").count() == 1
        assert page.locator("#task-chat .k-reason").inner_text() == (
            "Why k now: static: task=chat concurrency=40 band 33-64 -> k=0"
        )
        assert "fewer than two requests" in page.locator("#task-code .k-history").inner_text()
        assert (
            page.locator("#task-code .k-reason").inner_text().endswith("no request finished yet.")
        )
        screenshot(page, "sample-overview")
    assert all(url.startswith(dashboard) or url.startswith("data:") for url in page.watch.urls), (
        f"the page fetched something off-origin: {page.watch.urls}"
    )


def test_invalid_edit_shows_errors_and_keeps_the_policy(
    page: Any, dashboard: str, store: PolicyStore, screenshot: Any
) -> None:
    with opened(page, f"{dashboard}/dashboard", expected_statuses=(422,)):
        expect(page.locator("#policy-text")).to_have_value(re.compile("kind: static"))
        page.fill("#policy-text", BAD_BANDS + "  surprise: 1\n")
        # validated on the server while typing, then refused on apply
        page.wait_for_selector("#policy-errors li")
        page.click("#btn-apply")
        page.wait_for_selector("#editor-status.error >> text=not applied")
        errors = page.locator("#policy-errors li").all_inner_texts()
        assert any("static.concurrency_bands" in e and "line 6" in e for e in errors), errors
        assert any("static.surprise: unknown key" in e and "line 12" in e for e in errors), errors
        screenshot(page, "invalid-edit")
        page.click("#policy-errors li button.link >> text=line 6")
        selected = page.evaluate(
            "(() => { const t = document.getElementById('policy-text');"
            " return t.value.slice(t.selectionStart, t.selectionEnd); })()"
        )
        assert "concurrency_bands: [8, 64, 32]" in selected
    assert store.current()[0] == 1 and store.current()[1] == STATIC_POLICY_TEXT


def test_valid_edit_applies_then_rollback(page: Any, dashboard: str, store: PolicyStore) -> None:
    with opened(page, f"{dashboard}/dashboard?interval_ms=300"):
        expect(page.locator("#policy-text")).to_have_value(re.compile("kind: static"))
        page.fill("#policy-text", CHAT_OFF)
        page.click("#btn-apply")
        page.wait_for_selector("#editor-status.ok >> text=applied: now version 2")
        assert store.current()[:2] == (2, CHAT_OFF)
        page.wait_for_selector("#policy-version >> text=v2")
        assert page.locator("#versions tbody tr").count() == 2
        page.click('#versions tr[data-version="1"] button.rollback')
        page.wait_for_selector("#editor-status.ok >> text=now version 3")
        page.wait_for_selector("#policy-version >> text=v3")
        assert store.current()[1] == STATIC_POLICY_TEXT
        assert page.input_value("#policy-text") == STATIC_POLICY_TEXT


def test_editor_follows_a_change_made_elsewhere(
    page: Any, dashboard: str, store: PolicyStore
) -> None:
    with opened(page, f"{dashboard}/dashboard?interval_ms=300"):
        expect(page.locator("#policy-text")).to_have_value(re.compile("kind: static"))
        store.apply(CHAT_OFF)  # e.g. the policy file was edited
        expect(page.locator("#policy-text")).to_have_value(CHAT_OFF)
        assert page.locator("#policy-version").inner_text() == "v2"


def test_token_prompt_unlocks_the_editor(page: Any, serve_app: Any, store: PolicyStore) -> None:
    app = sample_app(store, token="s3cret")
    with serve_app(app) as base, opened(page, f"{base}/dashboard", expected_statuses=(401,)):
        page.wait_for_selector("#btn-unlock:visible")
        assert page.is_disabled("#btn-apply")
        page.click("#btn-unlock")
        page.fill("#token-input", "wrong")
        page.click("#token-save")
        page.wait_for_selector("#token-error:visible")  # 401 again -> asked again
        page.fill("#token-input", "s3cret")
        page.click("#token-save")
        expect(page.locator("#policy-text")).to_have_value(re.compile("kind: static"))
        page.fill("#policy-text", CHAT_OFF)
        page.click("#btn-apply")
        page.wait_for_selector("#editor-status.ok >> text=applied: now version 2")
    assert store.current()[0] == 2


def test_loopback_only_message_when_remote_without_token(
    page: Any, dashboard: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("controller.admin_auth.is_loopback", lambda host: False)
    page.goto(f"{dashboard}/dashboard")
    page.wait_for_selector("#editor-status.error >> text=loopback")
    assert page.is_disabled("#policy-text")
