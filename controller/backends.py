"""Build a Backend from its config section, chosen by ``kind``."""

from __future__ import annotations

import importlib

from controller.config import BackendConfig, EmbeddedBackend, RemotePool
from controller.step_control import StepControllerFactory
from engines.base import Backend


def build_backend(config: BackendConfig, step_controllers: StepControllerFactory) -> Backend:
    """``step_controllers`` makes the per-step k controller of an embedded-engine request."""
    if isinstance(config, RemotePool):
        from engines.pool import PoolBackend

        return PoolBackend(config)
    assert isinstance(config, EmbeddedBackend), f"unhandled backend kind {config.kind}"
    # Imported on use: the embedded engine needs torch, the rest of the daemon does not.
    module = importlib.import_module("engines.embedded_backend")
    backend: Backend = module.EmbeddedEngineBackend(config, step_controllers)
    return backend
