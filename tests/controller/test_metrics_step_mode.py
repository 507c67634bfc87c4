"""The auto step mode of an embedded backend reaches /metrics: per batch-size bucket the mode
it runs (-1 while measuring) and each mode's measured tokens per second."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controller.app import Probes
from controller.metrics import Metrics


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_scrapes_export_each_buckets_mode_and_rates() -> None:
    metrics = Metrics()
    steps = SimpleNamespace(
        step_modes=lambda: [(8, None, 1200.0, None), (64, False, 7000.0, 6500.0)]
    )
    backend: Any = SimpleNamespace(
        name="emb", steps=steps, num_inflight=lambda: 3, is_healthy=lambda: True
    )
    pool: Any = SimpleNamespace(name="vllm", num_inflight=lambda: 0, is_healthy=lambda: True)
    fleet: Any = SimpleNamespace(backends=[backend, pool])
    policy: Any = lambda: SimpleNamespace(version=2)  # noqa: E731
    Probes(fleet, None, metrics, policy, lambda: False).refresh_gauges()  # type: ignore[arg-type]
    got = samples(metrics)
    mode = "draftctl_step_mode"
    rate = "draftctl_step_mode_tokens_per_second"
    assert got[(mode, (("backend", "emb"), ("rows", "64")))] == 0.0  # one-phase runs
    assert got[(mode, (("backend", "emb"), ("rows", "8")))] == -1.0  # still measuring
    assert got[(rate, (("backend", "emb"), ("mode", "two_phase"), ("rows", "64")))] == 6500.0
    assert got[(rate, (("backend", "emb"), ("mode", "one_phase"), ("rows", "8")))] == 1200.0
    assert (rate, (("backend", "emb"), ("mode", "two_phase"), ("rows", "8"))) not in got
    assert not any(
        labels and dict(labels).get("backend") == "vllm" for n, labels in got if n == mode
    )
