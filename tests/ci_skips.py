"""The one list of tests allowed to skip in CI, with reasons (tests/conftest.py enforces it).

With ``CI=1`` (or ``true``) or ``DRAFTCTL_STRICT_SKIPS=1`` in the environment (``make test`` sets
the latter; ``DRAFTCTL_STRICT_SKIPS=0`` turns the check off), a skipped test or module that no
entry here allows fails the run: a missing data set (``../shared/data``, the PyPI data
packages), browser (``scripts/install_browser.sh``), vLLM venv, C extension or dependency
(``importorskip``) must be installed, not hidden. Outside CI skips stay plain skips.

An entry allows a skip when the test's node id matches ``node_ids`` (an fnmatch pattern over
ids relative to the repository root, e.g. ``tests/x/test_y.py::test_z[param]``; a module that
skips as a whole has the id ``tests/x/test_y.py``) and the skip's reason contains ``reason``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class AllowedSkip:
    node_ids: str  # fnmatch pattern over pytest node ids
    reason: str  # a substring the skip's own reason must contain
    why: str  # why CI may skip these tests


ALLOWED_SKIPS: tuple[AllowedSkip, ...] = (
    AllowedSkip(
        node_ids="tests/engines/embedded/test_isolation_cuda.py*",
        reason="needs CUDA",
        why="the CUDA-graph runner's isolation tests need a GPU, which CI's machine lacks; they "
        "were run on an H200 (docs/engine.md, 'Failure isolation')",
    ),
)


def allowed_skip(node_id: str, reason: str) -> AllowedSkip | None:
    """The entry that allows this skip, or None."""
    return next(
        (a for a in ALLOWED_SKIPS if fnmatchcase(node_id, a.node_ids) and a.reason in reason),
        None,
    )
