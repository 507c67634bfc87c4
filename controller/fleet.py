"""The configured backends, grouped by the model name clients address."""

from __future__ import annotations

from engines.base import Backend


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
