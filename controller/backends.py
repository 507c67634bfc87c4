"""Build a Backend from its config section, chosen by ``kind``."""

from __future__ import annotations

import importlib

from controller.config import BackendConfig, EmbeddedBackend, RemotePool
from engines.base import Backend


def build_backend(config: BackendConfig) -> Backend:
    if isinstance(config, RemotePool):
        from engines.pool import PoolBackend

        return PoolBackend(config)
    assert isinstance(config, EmbeddedBackend), f"unhandled backend kind {config.kind}"
    # Imported on use: the embedded engine needs torch, the rest of the daemon does not.
    module = importlib.import_module("engines.embedded_backend")
    backend: Backend = module.EmbeddedEngineBackend(config)
    return backend
