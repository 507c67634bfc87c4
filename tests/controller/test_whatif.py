"""The what-if endpoint's limits: a replay that runs past its time is a 4xx the client can act
on (a shorter window), never a 5xx; a bad window is refused before anything runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import controller.whatif as whatif
from controller.config import RecordingConfig
from controller.openai_errors import ApiError


def test_a_replay_past_its_time_is_a_422_naming_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(whatif, "_TIMEOUT_S", 0.01)  # the child cannot even start in time
    recording = RecordingConfig(enabled=True, path=tmp_path / "served.jsonl")
    runner = whatif.WhatIf(recording, lambda: "kind: static\n")
    with pytest.raises(ApiError) as raised:
        asyncio.run(runner._simulate("kind: static\n", 3600.0))
    assert raised.value.status == 422 and "shorter window_s" in str(raised.value)


@pytest.mark.parametrize("raw", ["0", "-5", "nan", "inf", "1e99", "abc", "\u00e9"])
def test_a_bad_window_is_a_400(raw: str) -> None:
    with pytest.raises(ApiError) as raised:
        whatif._window(raw)
    assert raised.value.status == 400
