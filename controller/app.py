"""The Starlette application: every HTTP route the daemon answers, in one list."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from controller.fleet import Fleet
from controller.gateway import Gateway
from controller.metrics import Metrics
from controller.openai_errors import ApiError
from controller.policy.running import RunningPolicy
from controller.stats import LiveStats
from engines.base import Endpoint

log = logging.getLogger(__name__)


class Probes:
    """``/healthz``, ``/readyz``, ``/metrics`` and ``/api/stats``."""

    def __init__(
        self,
        fleet: Fleet,
        stats: LiveStats,
        metrics: Metrics,
        policy: Callable[[], RunningPolicy],
        is_draining: Callable[[], bool],
    ) -> None:
        self.fleet = fleet
        self.stats = stats
        self.metrics = metrics
        self.policy = policy
        self.is_draining = is_draining

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        models = self.fleet.is_ready()
        is_ready = all(models.values()) and not self.is_draining()
        body = {"ready": is_ready, "draining": self.is_draining(), "models": models}
        return JSONResponse(body, status_code=200 if is_ready else 503)

    async def metrics_text(self, request: Request) -> Response:
        self.refresh_gauges()
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    def refresh_gauges(self) -> None:
        self.metrics.policy_version.set(self.policy().version)
        for backend in self.fleet.backends:
            self.metrics.inflight.labels(backend.name).set(backend.num_inflight())
            self.metrics.backend_up.labels(backend.name).set(1 if backend.is_healthy() else 0)
            steps = getattr(backend, "steps", None)  # the embedded engine's step controller
            if steps is not None and hasattr(steps, "step_modes"):
                self.metrics.set_step_modes(backend.name, steps.step_modes())
            if steps is not None and hasattr(steps, "calibrations"):
                self.metrics.set_calibrations(backend.name, steps.calibrations())
            if steps is not None and hasattr(steps, "scored_ahead"):
                self.metrics.set_device_scorings(
                    backend.name, steps.scored_ahead, steps.scored_late
                )
            counts = getattr(backend, "step_counts", None)  # the embedded engine's steps
            if counts is not None:
                self.metrics.set_engine_steps(backend.name, counts())

    async def api_stats(self, request: Request) -> Response:
        snapshot = self.stats.snapshot(
            time.monotonic(), time.time(), self.fleet.backends, self.policy().describe()
        )
        return JSONResponse(snapshot)


class HotPath:
    """ASGI front: the two completion routes skip Starlette's router and middleware stack.

    Measured with bench/gateway_overhead.py: those layers are a visible share of the CPU a
    relayed request costs. Everything else (and any other method) goes to the Starlette app.
    """

    def __init__(self, app: Starlette, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway
        self.endpoints: dict[str, Endpoint] = {
            "/v1/chat/completions": "chat",
            "/v1/completions": "completion",
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.endpoints.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = await self.gateway.serve(scope, receive, endpoint)
        except Exception:
            log.exception("unhandled error on %s", scope["path"])
            error = ApiError(500, "Internal error in draftctl; see its log", "server_error")
            response = error.response()
        await response(scope, receive, send)


def build_app(gateway: Gateway, probes: Probes, extra: list[BaseRoute]) -> HotPath:
    routes: list[BaseRoute] = [
        Route("/v1/chat/completions", gateway.chat, methods=["POST"]),
        Route("/v1/completions", gateway.completions, methods=["POST"]),
        Route("/v1/models", gateway.models, methods=["GET"]),
        Route("/healthz", probes.healthz, methods=["GET"]),
        Route("/readyz", probes.readyz, methods=["GET"]),
        Route("/metrics", probes.metrics_text, methods=["GET"]),
        Route("/api/stats", probes.api_stats, methods=["GET"]),
        *extra,
    ]
    return HotPath(Starlette(routes=routes), gateway)
