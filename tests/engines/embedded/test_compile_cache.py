"""torch.compile's on-disk caches in a folder of the operator's choosing
(engines/embedded/compile_cache.py): set where the environment names none, left alone where it
does, and skipped with a warning where the folder cannot be made."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from engines.embedded import compile_cache
from engines.embedded.compile_cache import (
    INDUCTOR_VARIABLE,
    TRITON_VARIABLE,
    initial_environment,
    use_compile_cache,
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INDUCTOR_VARIABLE, raising=False)
    monkeypatch.delenv(TRITON_VARIABLE, raising=False)


def test_an_unset_environment_gets_the_folder(tmp_path: Path) -> None:
    import os

    folder = tmp_path / "state" / "compile-cache"
    effective = use_compile_cache(folder)
    assert effective == {
        INDUCTOR_VARIABLE: str(folder.resolve()),
        TRITON_VARIABLE: str(folder.resolve() / "triton"),
    }
    assert os.environ[INDUCTOR_VARIABLE] == str(folder.resolve())
    assert (folder / "triton").is_dir()


def test_the_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    monkeypatch.setenv(INDUCTOR_VARIABLE, str(tmp_path / "mine"))
    started = {INDUCTOR_VARIABLE: str(tmp_path / "mine")}  # as the operator started it
    monkeypatch.setattr(compile_cache, "initial_environment", lambda: started)
    with caplog.at_level(logging.INFO, logger="engines.embedded.compile_cache"):
        effective = use_compile_cache(tmp_path / "configured")
    assert effective[INDUCTOR_VARIABLE] == str(tmp_path / "mine")
    assert os.environ[INDUCTOR_VARIABLE] == str(tmp_path / "mine")
    assert effective[TRITON_VARIABLE] == str((tmp_path / "configured" / "triton").resolve())
    assert "from the environment" in caplog.text


def test_a_folder_that_cannot_be_made_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="engines.embedded.compile_cache"):
        effective = use_compile_cache(blocker / "cache")
    assert effective == {} and INDUCTOR_VARIABLE not in os.environ
    assert "compiling without it" in caplog.text


def test_a_folder_torch_set_inside_the_process_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Inductor writes its default folder into the variable the first time anything asks for
    it; the process did not start with it, so the configured folder is used."""
    import os

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.setattr(compile_cache, "initial_environment", lambda: {})
    monkeypatch.setenv(INDUCTOR_VARIABLE, str(tmp_path / "torch-default"))
    with caplog.at_level(logging.INFO, logger="engines.embedded.compile_cache"):
        effective = use_compile_cache(tmp_path / "configured")
    configured = str((tmp_path / "configured").resolve())
    assert effective[INDUCTOR_VARIABLE] == os.environ[INDUCTOR_VARIABLE] == configured
    assert cache_dir() == configured  # what inductor uses from now on
    assert "set inside this process" in caplog.text


def test_the_initial_environment_is_the_one_the_process_started_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DRAFTCTL_TEST_SET_LATER", "1")
    started = initial_environment()
    assert started is not None and "DRAFTCTL_TEST_SET_LATER" not in started
    assert started.get("PATH") == os.environ.get("PATH") or "PATH" not in started
