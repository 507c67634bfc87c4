"""The embedded backend's health: loaded, its loop alive, and not stalled."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from engines.config import EmbeddedConfig
from engines.embedded_backend import EmbeddedEngineBackend
from engines.step_controller import FixedPolicySource
from policies.model import PolicySpec
from policies.registry import build_policy


@dataclass
class Loop:
    alive: bool
    stalled_s: float

    def is_alive(self) -> bool:
        return self.alive

    def seconds_since_progress(self) -> float:
        return self.stalled_s


def _backend(tmp_path: Path, **settings: object) -> EmbeddedEngineBackend:
    config = EmbeddedConfig(
        name="e",
        kind="embedded",
        model="m",
        target=tmp_path,
        draft=tmp_path,
        **{"stall_timeout_s": 30, **settings},  # type: ignore[arg-type]
    )
    spec = PolicySpec()
    return EmbeddedEngineBackend(config, FixedPolicySource(spec, build_policy(spec), None))


def test_not_ready_until_loaded_and_while_the_loop_is_dead_or_stalled(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    assert not backend.is_healthy()  # not loaded yet
    backend._engine = Loop(alive=True, stalled_s=0.0)
    assert backend.is_healthy()
    backend._engine = Loop(alive=True, stalled_s=31.0)  # work pending, no step for 31 s
    assert not backend.is_healthy()
    backend._engine = Loop(alive=False, stalled_s=0.0)
    assert not backend.is_healthy()


def test_k_range_is_adjustable_up_to_the_block(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    assert backend.is_adjustable and backend.max_spec_tokens == backend.block_size - 1
    assert backend.step_counts() == {}  # no engine loaded yet


def test_start_passes_the_compile_settings_to_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compile_attention_ahead`` (and the other engine settings) reach ``AsyncEngine.load``."""
    from engines.embedded import AsyncEngine

    seen: dict[str, object] = {}

    def load(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(AsyncEngine, "load", load)
    for ahead, burst in ((True, 4), (False, 1)):
        backend = _backend(
            tmp_path,
            compile_attention_ahead=ahead,
            attention="sdpa",
            plain_burst=burst,
            spec_burst=burst + 1,
            plain_chain=ahead,
        )
        with pytest.raises(RuntimeError, match="stop here"):
            asyncio.run(backend.start())
        assert seen["compile_attention_ahead"] is ahead
        assert seen["attention"] == "sdpa"
        assert seen["plain_burst"] == burst and seen["spec_burst"] == burst + 1
        assert seen["plain_chain"] is ahead
