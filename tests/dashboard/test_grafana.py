"""The shipped Grafana dashboard queries only metrics the daemon really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controller.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "grafana" / "draftctl.json"
REQUIRED = {
    "draftctl_requests_total",
    "draftctl_spec_tokens_chosen_total",
    "draftctl_inflight_requests",
    "draftctl_accept_length",
    "draftctl_classify_seconds_bucket",
    "draftctl_request_seconds_bucket",
    "draftctl_policy_version",
    "draftctl_backend_up",
}
SERIES = re.compile(r"\bdraftctl_[a-z_]+\b")
LABELS = re.compile(r"(?:by \(([^)]*)\))|(\w+)=~")


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def exported_series() -> dict[str, set[str]]:
    """Series name -> label names, from a real Metrics registry with one of everything."""
    metrics = Metrics()
    metrics.count_request("math", "pool-a", 7)
    metrics.inflight.labels("pool-a").set(1)
    metrics.accept_length.labels("math", "pool-a").set(3.0)
    metrics.classify_seconds.observe(1e-4)
    metrics.request_seconds.observe(0.2)
    metrics.policy_version.set(3)
    metrics.backend_up.labels("pool-a").set(1)
    metrics.set_engine_steps("pool-a", {"plain": (8, 2)})
    metrics.set_calibrations("pool-a", {"math": 0.9})
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def test_every_required_metric_has_a_panel() -> None:
    used = {name for e in exprs(load()) for name in SERIES.findall(e)}
    assert REQUIRED <= used, f"no panel for {sorted(REQUIRED - used)}"


def test_queries_use_only_exported_series_and_labels() -> None:
    series = exported_series()
    for expr in exprs(load()):
        names = SERIES.findall(expr)
        for name in names:
            assert name in series, f"{name} in {expr!r} is not exported by controller.metrics"
        labels = {
            label.strip()
            for by, matcher in LABELS.findall(expr)
            for label in (by.split(",") if by else [matcher])
        } - {"le", "instance"}
        known = set().union(*(series[n] for n in names))
        assert labels <= known, f"{expr!r} uses labels {sorted(labels - known)} not exported"


def test_panels_are_well_formed() -> None:
    dashboard = load()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in dashboard["panels"]:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, f"{p['title']} is wider than the grid"
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert names == {"datasource", "instance", "task"}
