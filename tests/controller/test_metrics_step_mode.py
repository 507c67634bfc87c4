"""The auto step mode of an embedded backend reaches /metrics: per batch-size bucket the mode
it runs (-1 while measuring), each mode's measured tokens per second, and the paired ratio the
mode is chosen on with its number of pairs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.app import Probes
from controller.metrics import Metrics
from policies.step_mode import BucketView, ModeSettings, StepModeChooser


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


POOL: Any = SimpleNamespace(name="vllm", num_inflight=lambda: 0, is_healthy=lambda: True)


def scrape(*backends: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One /metrics refresh over ``backends`` (stand-ins for the fleet's), its samples."""
    metrics = Metrics()
    fleet: Any = SimpleNamespace(backends=list(backends))
    policy: Any = lambda: SimpleNamespace(version=1)  # noqa: E731
    Probes(fleet, None, metrics, policy, lambda: False).refresh_gauges()  # type: ignore[arg-type]
    return samples(metrics)


def test_scrapes_export_each_buckets_mode_and_rates() -> None:
    steps = SimpleNamespace(
        step_modes=lambda: [
            BucketView(8, None, 1200.0, None, None, 0),
            BucketView(64, False, 7000.0, 6500.0, 0.94, 3),
        ]
    )
    backend: Any = SimpleNamespace(
        name="emb", steps=steps, num_inflight=lambda: 3, is_healthy=lambda: True
    )
    got = scrape(backend, POOL)
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
    paired, pairs = "draftctl_step_mode_paired_ratio", "draftctl_step_mode_pairs"
    assert got[(paired, (("backend", "emb"), ("rows", "64")))] == 0.94
    assert got[(pairs, (("backend", "emb"), ("rows", "64")))] == 3.0
    assert (paired, (("backend", "emb"), ("rows", "8"))) not in got  # no pair yet
    assert got[(pairs, (("backend", "emb"), ("rows", "8")))] == 0.0


def test_a_choosers_buckets_carry_the_paired_ratio_it_decides_on() -> None:
    """The view the metrics read is the chooser's own: after a learning run whose two-phase
    blocks emit 10% fewer tokens per second, the 64-row bucket runs one-phase and its paired
    ratio says why (the pooled rates alone compare different traffic)."""
    settings = ModeSettings(probe_steps=2, learn_steps=4)
    chooser = StepModeChooser(settings)
    for _ in range(40):
        two_phase = bool(chooser.decide(64))
        chooser.record(64, two_phase, 90 if two_phase else 100, 1.0)
    (view,) = chooser.buckets()
    assert view.rows == 64 and view.incumbent is False
    assert view.pairs >= 2 and view.paired_ratio == pytest.approx(0.9)
    assert view.one_phase_tok_s == pytest.approx(100.0)
    assert view.two_phase_tok_s == pytest.approx(90.0)


def test_scrapes_export_when_device_allocated_steps_were_scored() -> None:
    """``slot_allocation: device``: how many device-allocated steps were scored while the
    previous step ran and how many between their draft and verify (a new row joined)."""
    steps = SimpleNamespace(step_modes=lambda: [], scored_ahead=40, scored_late=3)
    backend: Any = SimpleNamespace(
        name="emb", steps=steps, num_inflight=lambda: 3, is_healthy=lambda: True
    )
    got = scrape(backend)
    name = "draftctl_device_scored_steps"
    assert got[(name, (("backend", "emb"), ("made", "ahead")))] == 40.0
    assert got[(name, (("backend", "emb"), ("made", "late")))] == 3.0


def test_scrapes_export_the_engines_steps_and_round_trips() -> None:
    """An embedded backend's decode steps per kind and the host round trips they took (steps
    per round trip above 1: its plain or drafting bursts ran)."""
    counts = {"plain": (400, 100), "drafting": (50, 50)}
    backend: Any = SimpleNamespace(
        name="emb", num_inflight=lambda: 1, is_healthy=lambda: True, step_counts=lambda: counts
    )
    got = scrape(backend)
    name = "draftctl_engine_steps"
    for kind, (steps, trips) in counts.items():
        assert got[(name, (("backend", "emb"), ("count", "steps"), ("kind", kind)))] == steps
        assert got[(name, (("backend", "emb"), ("count", "round_trips"), ("kind", kind)))] == trips


def test_scrapes_export_each_tasks_calibration_factor() -> None:
    """``shared_calibration``: the embedded planner's factor per task (below 1: the task
    estimates overstate that task's rows); a backend without one exports none."""
    steps = SimpleNamespace(
        step_modes=lambda: [], calibrations=lambda: {"math": 0.62, "code": 1.0, "chat": 0.97}
    )
    backend: Any = SimpleNamespace(
        name="emb", steps=steps, num_inflight=lambda: 1, is_healthy=lambda: True
    )
    got = scrape(backend, POOL)
    name = "draftctl_calibration_factor"
    assert got[(name, (("backend", "emb"), ("task", "math")))] == 0.62
    assert got[(name, (("backend", "emb"), ("task", "chat")))] == 0.97
    assert not any(n == name and dict(labels).get("backend") == "vllm" for n, labels in got)
