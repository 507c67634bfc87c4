"""The embedded DFlash engine: own PyTorch forwards, continuous batching, per-request k.

Public API (see docs/engine.md): ``AsyncEngine``, ``SamplingParams``, ``RequestView``,
``StepReport``, ``TokenEvent``. Importing this package does not import torch; the names are
resolved lazily so ``controller`` modules can reference them cheaply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engines.embedded.events import (
    FinishReason,
    RequestFailed,
    RequestView,
    SamplingParams,
    SpecController,
    StepReport,
    TokenEvent,
)

if TYPE_CHECKING:
    from engines.embedded.api import AsyncEngine, EngineClosed

__all__ = [
    "AsyncEngine",
    "EngineClosed",
    "FinishReason",
    "RequestFailed",
    "RequestView",
    "SamplingParams",
    "SpecController",
    "StepReport",
    "TokenEvent",
]


def __getattr__(name: str) -> Any:
    if name in ("AsyncEngine", "EngineClosed"):
        from engines.embedded import api

        return getattr(api, name)
    raise AttributeError(f"module 'engines.embedded' has no attribute {name!r}")
