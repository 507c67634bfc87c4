"""The daemon: one Server with startup, main loop and shutdown (the uvicorn shape).

Signal handlers only set flags. SIGTERM reports not-ready at once and keeps serving for
``server.drain_grace_s`` (so that a load balancer polling ``/readyz`` sees the 503 and stops
routing here), then stops accepting connections and lets in-flight requests finish for up to
``server.drain_timeout_s``. SIGINT skips the grace; a second signal forces the exit.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import time
from typing import Any, cast

import uvicorn
from starlette.routing import BaseRoute

from controller.admin import AdminAPI, admin_routes
from controller.admin_auth import AdminAuth
from controller.app import Probes, build_app
from controller.backends import build_backend
from controller.classifier import ArtifactError, Classifier, load_classifier
from controller.classifier.artifact import builtin_artifact_dir
from controller.config import Config
from controller.dashboard import dashboard_routes
from controller.fleet import Fleet
from controller.gateway import Gateway
from controller.http_protocol import ReadTimeoutProtocol
from controller.metrics import Metrics
from controller.planner import Planner
from controller.policy.source import PolicySource
from controller.recording import TraceRecorder, engine_header
from controller.scraping import Scraping
from controller.stats import LiveStats
from controller.step_source import DaemonStepSource
from controller.whatif import WhatIf, whatif_routes

log = logging.getLogger(__name__)

_TICK_S = 0.1
_GC_THRESHOLDS = (20_000, 50, 100)
_SAMPLE_EVERY_TICKS = 10


class StartupError(RuntimeError):
    """The daemon cannot start; the message says what to fix."""


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(True)
    return sock


class Server:
    def __init__(self, config: Config, host: str | None = None, port: int | None = None) -> None:
        self.config = config
        self.host = host or config.server.host
        self.port = config.server.port if port is None else port
        self.should_exit = False
        self.is_draining = False
        self._grace_until: float | None = None
        self.started = asyncio.Event()
        self.metrics = Metrics()
        self.stats = LiveStats(config.stats.window_s, time.monotonic())
        steps = DaemonStepSource(lambda: self.policy.current(), self.stats, self.metrics)
        self.fleet = Fleet([build_backend(b, steps) for b in config.backends])
        block_size = max(b.block_size for b in self.fleet.backends)
        self.policy = PolicySource(config.policy, self.metrics, block_size)
        self.scraper = Scraping(config, self.stats)
        self.gateway: Gateway | None = None
        self.recorder = self._recorder()
        self._uvicorn: uvicorn.Server | None = None
        self._sock: socket.socket | None = None

    def _recorder(self) -> TraceRecorder | None:
        """The served-traffic trace when ``recording.enabled`` (started with the server)."""
        if not self.config.recording.enabled:
            return None
        batch_limits = {b.name: getattr(b, "max_batch_size", None) for b in self.config.backends}

        def headers() -> list[dict[str, Any]]:
            return [engine_header(b, batch_limits.get(b.name)) for b in self.fleet.backends]

        return TraceRecorder(self.config.recording, headers)

    def handle_exit(self, sig: int) -> None:
        if self.should_exit or self.is_draining:  # a second signal: no grace, no drain
            self._grace_until = None
            if self._uvicorn is not None:
                self._uvicorn.force_exit = True
            self.should_exit = True
            return
        self.is_draining = True  # /readyz answers 503 from now on
        grace = self.config.server.drain_grace_s
        if sig == signal.SIGTERM and grace > 0:
            log.info("SIGTERM: not ready; serving %.1f s more before draining", grace)
            self._grace_until = time.monotonic() + grace
        else:
            self.should_exit = True

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.handle_exit, sig)

    async def serve(self, install_signals: bool = True) -> None:
        if install_signals:
            self.install_signal_handlers()
        await self.startup()
        try:
            await self.main_loop()
        finally:
            await self.shutdown()

    async def startup(self) -> None:
        self._sock = bind_socket(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        await self.policy.start()
        try:
            await asyncio.gather(*(b.start() for b in self.fleet.backends), self.scraper.start())
        except Exception as exc:
            await self.shutdown()
            raise StartupError(f"a backend failed to start: {exc}") from exc
        if self.recorder is not None:
            self.recorder.start()
            log.info("recording served requests to %s", self.recorder.path)
        app = build_app(*self._components(), self._extra_routes())
        server = self.config.server
        config = uvicorn.Config(
            app,
            lifespan="off",
            # httptools, plus header and body read timeouts (uvicorn has none).
            http=ReadTimeoutProtocol.configured(server.header_timeout_s, server.body_timeout_s),
            log_config=None,
            access_log=False,
            # uvicorn types these int, but only hands them to call_later/wait_for: floats work.
            timeout_keep_alive=cast(int, server.keep_alive_timeout_s),
            timeout_graceful_shutdown=cast(int, server.drain_timeout_s),
        )
        config.load()
        self._uvicorn = uvicorn.Server(config)
        self._uvicorn.lifespan = config.lifespan_class(config)
        await self._uvicorn.startup(sockets=[self._sock])
        # Everything loaded so far lives as long as the process: keep it out of the cyclic
        # GC's full collections, which otherwise scan it and show up in tail latency.
        gc.collect()
        gc.freeze()
        # Fewer, larger young-generation collections: with the default (700, 10, 10) the
        # cyclic GC took ~0.09 ms of every streamed request at 256 concurrent streams
        # (bench/gateway_overhead.py), with 3 ms gen-1 and 12 ms gen-2 pauses; ~0.02 ms here.
        gc.set_threshold(*_GC_THRESHOLDS)
        log.info("draftctl listening on http://%s:%d", self.host, self.port)
        self.started.set()

    def _components(self) -> tuple[Gateway, Probes]:
        cfg = self.config
        planner = Planner(cfg.classifier, self._classifier(), self.stats, self.metrics)
        self.gateway = Gateway(
            cfg.server,
            self.fleet,
            planner,
            self.stats,
            self.metrics,
            self.policy.current,
            cfg.classifier.allow_client_hint,
            self.recorder,
        )
        probes = Probes(
            self.fleet, self.stats, self.metrics, self.policy.current, lambda: self.is_draining
        )
        return self.gateway, probes

    def _classifier(self) -> Classifier | None:
        cfg = self.config.classifier
        if cfg.artifact is None and not (builtin_artifact_dir() / "manifest.json").exists():
            log.warning("no built-in classifier artifact; every request is %s", cfg.fallback_task)
            return None
        try:
            return load_classifier(cfg.artifact, cfg.max_chars)
        except (ArtifactError, OSError) as exc:
            where = cfg.artifact or "the built-in artifact"
            raise StartupError(f"classifier.artifact: cannot load {where}: {exc}") from exc

    def _extra_routes(self) -> list[BaseRoute]:
        auth = AdminAuth.from_env(self.config.admin.token_env)
        api = AdminAPI(self.policy.store, auth)
        whatif = WhatIf(self.config.recording, lambda: self.policy.store.current()[1])
        return [
            *admin_routes(self.policy.store, auth, api),
            *whatif_routes(api, whatif),
            *dashboard_routes(),
        ]

    async def main_loop(self) -> None:
        assert self._uvicorn is not None, "startup() first"
        counter = 0
        while not self.should_exit:
            if self._grace_until is not None and time.monotonic() >= self._grace_until:
                self._grace_until = None
                self.should_exit = True
                break
            await self._uvicorn.on_tick(counter)
            if counter % _SAMPLE_EVERY_TICKS == 0:
                inflight = self.gateway.num_inflight if self.gateway else 0
                self.stats.sample_concurrency(time.monotonic(), time.time(), inflight)
                self.scraper.publish()
            counter += 1
            await asyncio.sleep(_TICK_S)

    async def shutdown(self) -> None:
        self.is_draining = True
        if self.gateway is not None:
            self.gateway.is_draining = True  # what uvicorn cancels after the drain says why
        inflight = self.gateway.num_inflight if self.gateway else 0
        log.info("shutting down: draining %d in-flight request(s)", inflight)
        if self._uvicorn is not None:
            await self._uvicorn.shutdown(sockets=[self._sock] if self._sock else None)
        elif self._sock is not None:
            self._sock.close()
        await self.policy.close()
        await self.scraper.close()
        if self.recorder is not None:
            await asyncio.to_thread(self.recorder.close)
        await asyncio.gather(*(b.close() for b in self.fleet.backends), return_exceptions=True)
        log.info("stopped")
