"""The configured backends, grouped by the model name clients address."""

from __future__ import annotations

from engines.base import Backend
from policies.types import PoolView


def routing_view(backend: Backend) -> PoolView:
    """The routing view of one backend (a per-request-k engine shows its largest k)."""
    k = backend.block_size - 1 if backend.spec_tokens is None else backend.spec_tokens
    return PoolView(
        backend.name, k, backend.block_size, backend.num_inflight(), backend.is_healthy()
    )


class Fleet:
    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends
        self._by_model: dict[str, list[Backend]] = {}
        for backend in backends:
            self._by_model.setdefault(backend.model, []).append(backend)

    def models(self) -> list[str]:
        return list(self._by_model)

    def backends_for(self, model: str) -> list[Backend]:
        return self._by_model.get(model, [])

    def is_ready(self) -> dict[str, bool]:
        """Per model: does it have a healthy backend?"""
        return {m: any(b.is_healthy() for b in bs) for m, bs in self._by_model.items()}
