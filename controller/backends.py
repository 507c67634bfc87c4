"""Build a Backend from its config section, chosen by ``kind``."""

from __future__ import annotations

import importlib

from controller.config import BackendConfig
from engines.base import Backend
from engines.config import EmbeddedConfig, PoolConfig
from engines.step_controller import StepPolicySource


def build_backend(config: BackendConfig, policy_source: StepPolicySource) -> Backend:
    """``policy_source``: what the embedded engine's step controller reads to choose k."""
    if isinstance(config, PoolConfig):
        from engines.pool import PoolBackend

        return PoolBackend(config)
    assert isinstance(config, EmbeddedConfig), f"unhandled backend kind {config.kind}"
    # Imported on use: the embedded engine needs torch, the rest of the daemon does not.
    module = importlib.import_module("engines.embedded_backend")
    backend: Backend = module.EmbeddedEngineBackend(config, policy_source)
    return backend
