"""Prometheus metrics for one daemon, in their own registry (so tests can run several).

Labelled children are cached: ``labels()`` costs a lock and a dict build per call, and the
request path touches several metrics per request.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from policies.step_mode import BucketView

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_CLASSIFY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "draftctl_requests", "Requests served", ["task", "backend"], registry=r
        )
        self.spec_tokens_chosen = Counter(
            "draftctl_spec_tokens_chosen",
            "k each request ran with",
            ["task", "spec_tokens"],
            registry=r,
        )
        self.inflight = Gauge(
            "draftctl_inflight_requests", "Requests in flight", ["backend"], registry=r
        )
        self.accept_length = Gauge(
            "draftctl_accept_length",
            "Mean accepted tokens per verify step incl. bonus (windowed)",
            ["task", "backend"],
            registry=r,
        )
        self.classify_seconds = Histogram(
            "draftctl_classify_seconds",
            "Classifier latency",
            buckets=_CLASSIFY_BUCKETS,
            registry=r,
        )
        self.request_seconds = Histogram(
            "draftctl_request_seconds",
            "Request latency through the gateway",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.policy_version = Gauge("draftctl_policy_version", "Running policy version", registry=r)
        self.backend_up = Gauge(
            "draftctl_backend_up", "1 if the pool is healthy", ["backend"], registry=r
        )
        self.errors = Counter(
            "draftctl_backend_errors",
            "Backend failures (retried or mid-stream)",
            ["backend", "stage"],
            registry=r,
        )
        self.degraded = Counter(
            "draftctl_degraded_decisions",
            "Requests served with a safe fallback because a component failed",
            ["component"],
            registry=r,
        )
        self.step_mode = Gauge(
            "draftctl_step_mode",
            "Embedded engine, goodput step_mode auto: the mode a batch-size bucket runs "
            "(1 two-phase per-slot allocation, 0 one-phase shared k, -1 still measuring)",
            ["backend", "rows"],
            registry=r,
        )
        self.step_mode_tok_s = Gauge(
            "draftctl_step_mode_tokens_per_second",
            "Embedded engine, goodput step_mode auto: tokens per second of step time each mode "
            "emitted in a batch-size bucket (decayed)",
            ["backend", "rows", "mode"],
            registry=r,
        )
        self.step_mode_paired = Gauge(
            "draftctl_step_mode_paired_ratio",
            "Embedded engine, goodput step_mode auto: two-phase over one-phase tokens per "
            "second in paired blocks (the steps just before and after each change of mode), "
            "what a batch-size bucket's mode is chosen on; absent before its first pair",
            ["backend", "rows"],
            registry=r,
        )
        self.step_mode_pairs = Gauge(
            "draftctl_step_mode_pairs",
            "Embedded engine, goodput step_mode auto: paired blocks a batch-size bucket has "
            "measured",
            ["backend", "rows"],
            registry=r,
        )
        self.device_scorings = Gauge(
            "draftctl_device_scored_steps",
            "Embedded engine, goodput slot_allocation device: two-phase steps allocated on the "
            "device, by when their scoring was made (ahead: while the previous step ran; late: "
            "between their draft and verify, a new row joined)",
            ["backend", "made"],
            registry=r,
        )
        self.engine_steps = Gauge(
            "draftctl_engine_steps",
            "Embedded engine: decode steps run since start, by kind (plain: every row at k = 0; "
            "drafting) and what they cost the host (steps, round_trips: one per runner call; "
            "steps per round trip above 1 when plain_burst / spec_burst batch them)",
            ["backend", "kind", "count"],
            registry=r,
        )
        self.calibration = Gauge(
            "draftctl_calibration_factor",
            "Embedded engine, goodput shared decisions (shared_calibration): the factor on each "
            "task's drafted expectations, realized over expected drafted tokens of the rows "
            "the decisions drafted (below 1: the task estimates overstate that task's rows)",
            ["backend", "task"],
            registry=r,
        )
        self._counted: dict[tuple[str, str, int], tuple[Counter, Counter]] = {}
        self._accept: dict[tuple[str, str], Gauge] = {}

    def count_request(self, task: str, backend: str, spec_tokens: int) -> None:
        key = (task, backend, spec_tokens)
        children = self._counted.get(key)
        if children is None:
            children = (
                self.requests.labels(task, backend),
                self.spec_tokens_chosen.labels(task, str(spec_tokens)),
            )
            self._counted[key] = children
        children[0].inc()
        children[1].inc()

    def set_accept_length(self, task: str, backend: str, value: float) -> None:
        gauge = self._accept.get((task, backend))
        if gauge is None:
            gauge = self._accept[(task, backend)] = self.accept_length.labels(task, backend)
        gauge.set(value)

    def set_step_modes(self, backend: str, buckets: list[BucketView]) -> None:
        """The auto step mode's buckets of one embedded backend (``StepController.step_modes``)."""
        for view in buckets:
            label = str(view.rows)
            mode = -1 if view.incumbent is None else int(view.incumbent)
            self.step_mode.labels(backend, label).set(mode)
            rates = (("one_phase", view.one_phase_tok_s), ("two_phase", view.two_phase_tok_s))
            for name, rate in rates:
                if rate is not None:
                    self.step_mode_tok_s.labels(backend, label, name).set(rate)
            self.step_mode_pairs.labels(backend, label).set(view.pairs)
            if view.paired_ratio is not None:
                self.step_mode_paired.labels(backend, label).set(view.paired_ratio)

    def set_device_scorings(self, backend: str, ahead: int, late: int) -> None:
        """``StepController.scored_ahead`` / ``scored_late`` of one embedded backend."""
        self.device_scorings.labels(backend, "ahead").set(ahead)
        self.device_scorings.labels(backend, "late").set(late)

    def set_engine_steps(self, backend: str, counts: dict[str, tuple[int, int]]) -> None:
        """``EmbeddedEngineBackend.step_counts()`` of one backend."""
        for kind, (steps, round_trips) in counts.items():
            self.engine_steps.labels(backend, kind, "steps").set(steps)
            self.engine_steps.labels(backend, kind, "round_trips").set(round_trips)

    def set_calibrations(self, backend: str, factors: dict[str, float]) -> None:
        """``StepController.calibrations()`` of one embedded backend."""
        for task, factor in factors.items():
            self.calibration.labels(backend, task).set(factor)

    def render(self) -> bytes:
        return generate_latest(self.registry)
