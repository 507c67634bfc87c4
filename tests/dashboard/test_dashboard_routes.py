"""The dashboard's HTTP surface: the page, its whitelisted assets, and no third-party URLs."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.applications import Starlette
from starlette.testclient import TestClient

from controller.dashboard import ASSETS, dashboard_routes

ASSET_DIR = Path(__file__).resolve().parents[2] / "controller" / "dashboard"
client = TestClient(Starlette(routes=dashboard_routes()))


def test_page_is_served_with_a_strict_csp() -> None:
    response = client.get("/dashboard")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    csp = response.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert response.headers["x-content-type-options"] == "nosniff"


def test_trailing_slash_redirects_to_the_page() -> None:
    response = client.get("/dashboard/", follow_redirects=False)
    assert response.status_code == 308 and response.headers["location"] == "/dashboard"


def test_every_referenced_asset_is_served_with_its_type() -> None:
    html = client.get("/dashboard").text
    referenced = set(re.findall(r"/dashboard/assets/([\w.]+)", html))
    for name in ASSETS:
        text = (ASSET_DIR / name).read_text()
        referenced |= set(re.findall(r'from "\./([\w.]+)"', text))
    assert referenced == set(ASSETS), "assets and references disagree"
    for name in referenced:
        response = client.get(f"/dashboard/assets/{name}")
        assert response.status_code == 200, name
        assert response.headers["content-type"] == ASSETS[name]


def test_files_outside_the_whitelist_are_not_served() -> None:
    for name in ("__init__.py", "index.html", "..%2F__init__.py", "missing.js"):
        response = client.get(f"/dashboard/assets/{name}")
        assert response.status_code == 404, name
    assert "served:" in client.get("/dashboard/assets/missing.js").json()["error"]["message"]


def test_no_asset_loads_anything_from_another_origin() -> None:
    for name in ["index.html", *ASSETS]:
        text = (ASSET_DIR / name).read_text()
        urls = re.findall(r"https?://[^\s\"')]+", text)
        assert urls in ([], ["http://www.w3.org/2000/svg"]), f"{name} references {urls}"
        assert "@import" not in text and "url(" not in text, name
