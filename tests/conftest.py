"""Session-wide test policy: in CI a skip is a failure unless tests/ci_skips.py allows it.

Strict when ``DRAFTCTL_STRICT_SKIPS=1`` (``make test`` sets it) or, when that is unset, when
``CI`` is ``1`` or ``true``. A skipped test that no entry allows is reported as failed, with its
reason and where to list it; a module skipped at collection (``importorskip`` at module level,
a module-wide ``skipif``) has no test to fail, so it is listed in the summary and the run exits
non-zero. Expected failures (``xfail``) are not skips and are not policed here.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest
import torch

from tests.ci_skips import allowed_skip

# The split-KV attention kernels (engines/embedded/decode_attention.py) are Triton: without a
# GPU they run in Triton's CPU interpreter, which must be chosen before triton is first
# imported — and importing torch._dynamo (any test that compiles) imports it. Here, in the
# root conftest, before any test module is collected.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

STRICT_ENV = "DRAFTCTL_STRICT_SKIPS"


def is_strict() -> bool:
    value = os.environ.get(STRICT_ENV)
    if value is not None:
        return value == "1"
    return os.environ.get("CI", "").lower() in ("1", "true")


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """A skip's reason: pytest keeps it as (path, line, 'Skipped: reason')."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class SkipPolicy:
    """Fails unlisted skips; one per session, registered only in strict mode."""

    def __init__(self) -> None:
        self.unlisted: list[tuple[str, str]] = []  # (node id, reason)

    def _is_unlisted(self, report: pytest.TestReport | pytest.CollectReport) -> bool:
        if not report.skipped or hasattr(report, "wasxfail"):
            return False
        reason = skip_reason(report)
        if allowed_skip(report.nodeid, reason) is not None:
            return False
        self.unlisted.append((report.nodeid, reason))
        return True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if self._is_unlisted(report):
            reason = skip_reason(report)
            report.outcome = "failed"
            report.longrepr = (
                f"skipped in CI ({reason}), and tests/ci_skips.py does not allow it: install "
                "what it needs, or list it there with the reason CI may skip it"
            )
        return report

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # A failed collect report would abort the whole session; recorded here, it fails the
        # run at the end instead.
        self._is_unlisted(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unlisted and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.unlisted:
            return
        terminalreporter.section("skips not allowed in CI (tests/ci_skips.py)", red=True)
        for node_id, reason in self.unlisted:
            terminalreporter.line(f"{node_id}: {reason}")


def pytest_configure(config: pytest.Config) -> None:
    if is_strict():
        config.pluginmanager.register(SkipPolicy(), "draftctl-skip-policy")
