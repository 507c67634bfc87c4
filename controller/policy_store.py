"""The versioned policy store: the one place the running policy document changes.

Every accepted change (admin API, policy file edit, rollback) is validated, kept as a numbered
version (see ``policy_versions``), mirrored to the live policy file, both written atomically,
and announced to subscribers. An invalid change raises ``InvalidDocument`` and the running
policy stays as it was. Version numbers only grow: rolling back to version 3 stores a new
version whose text is version 3's. The ETag is derived from the version number and the text's
hash, so any accepted change changes it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.policy_versions import VersionLog, text_sha256, write_atomically
from policies.model import PolicySpec, parse_policy
from policies.registry import build_policy
from policies.validation import InvalidDocument, Problem

log = logging.getLogger(__name__)

Subscriber = Callable[[PolicySpec, int], None]

DEFAULT_POLICY_TEXT = """\
# draftctl policy. k = drafted tokens verified per step; 0 = drafting off.
kind: static
min_spec_tokens: 4          # smallest non-zero k any decision may use
static:
  # Inclusive upper edges of the concurrency bands: 1-8, 9-32, 33-64, >64.
  concurrency_bands: [8, 32, 64]
  # One k per band; "max" = max_spec_tokens (default: the draft's block size - 1).
  spec_tokens:
    math: [max, max, 7, 4]
    code: [max, max, 7, 4]
    chat: [7, 4, 4, 0]
"""


class PreconditionFailed(Exception):
    """``If-Match`` named an ETag that is not the current one (someone changed the policy)."""

    def __init__(self, if_match: str, current_etag: str):
        super().__init__(
            f"If-Match {if_match} does not match the current policy ETag {current_etag}; "
            "fetch the policy again, re-apply your edit and retry"
        )
        self.current_etag = current_etag


class UnknownVersion(LookupError):
    """A rollback or lookup named a version the store does not keep."""


@dataclass(frozen=True)
class ActivePolicy:
    version: int
    text: str
    spec: PolicySpec

    @property
    def etag(self) -> str:
        return f'"v{self.version}-{text_sha256(self.text)[:16]}"'


def validate_policy_text(text: str) -> PolicySpec:
    """Parse, validate, and check the policy kind can be built; raises InvalidDocument."""
    spec = parse_policy(text)
    try:
        build_policy(spec)
    except ValueError as exc:
        raise InvalidDocument([Problem("kind", str(exc), _line_of_key(text, "kind"))]) from exc
    return spec


def _line_of_key(text: str, key: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith(f"{key}:"):
            return number
    return None


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        message = f"the file is not UTF-8 text (bad byte at offset {exc.start})"
        raise InvalidDocument([Problem("", message)]) from exc


def etag_matches(if_match: str, etag: str) -> bool:
    """RFC 9110 If-Match: ``*`` or a comma-separated list of strong ETags."""
    candidates = [c.strip() for c in if_match.split(",")]
    return "*" in candidates or etag in candidates


class PolicyStore:
    """Validated, versioned, atomically written policy with change subscriptions."""

    def __init__(
        self,
        path: Path,
        versions_dir: Path,
        *,
        max_versions: int = 200,
        clock: Callable[[], float] = time.time,
    ):
        self.path = path
        self._log = VersionLog(versions_dir, max_versions)
        self._clock = clock
        self._lock = threading.RLock()
        self._subscribers: list[Subscriber] = []
        self.last_file_error: list[Problem] | None = None
        self.num_rejected_file_changes = 0
        self._active = self._load()

    # -- reading -------------------------------------------------------------------------

    def current(self) -> tuple[int, str, PolicySpec]:
        active = self._active
        return active.version, active.text, active.spec

    def etag(self) -> str:
        return self._active.etag

    def versions(self) -> list[dict[str, Any]]:
        """Every kept version, newest first; ``is_current`` marks the running one."""
        current = self._active.version
        return [{**r.as_dict(), "is_current": r.version == current} for r in self._log.records()]

    def version_text(self, version: int) -> str:
        if version not in self._log.numbers():
            raise UnknownVersion(f"policy version {version} is not kept; see GET versions")
        return self._log.read_text(version)

    # -- changing ------------------------------------------------------------------------

    def apply(self, text: str, if_match: str | None = None, source: str = "api") -> int:
        """Validate and activate ``text``; returns the running version number.

        Raises InvalidDocument (nothing changes) or PreconditionFailed. Applying the text
        that is already running is a no-op and returns the current version.
        """
        spec = validate_policy_text(text)
        with self._lock:
            active = self._active
            if if_match is not None and not etag_matches(if_match, active.etag):
                raise PreconditionFailed(if_match, active.etag)
            if text == active.text:
                return active.version
            record = self._log.append(text, source, self._clock())
            write_atomically(self.path, text.encode("utf-8"))
            self._active = ActivePolicy(record.version, text, spec)
            if source == "file":
                self.last_file_error = None
        log.info("policy version %d active (source: %s)", record.version, source)
        self._notify(spec, record.version)
        return record.version

    def apply_file_bytes(self, data: bytes) -> int:
        """Apply the live file's new contents; an invalid file is logged, counted and kept."""
        try:
            return self.apply(_decode(data), source="file")
        except InvalidDocument as exc:
            self.last_file_error = exc.problems
            self.num_rejected_file_changes += 1
            log.error(
                "policy file %s rejected, version %d stays active: %s",
                self.path,
                self._active.version,
                exc,
            )
            raise

    def rollback(self, version: int, if_match: str | None = None) -> int:
        """Activate a kept version's text again, as a new version; returns its number."""
        text = self.version_text(version)
        return self.apply(text, if_match=if_match, source=f"rollback:{version}")

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(spec, version)`` after every change; returns an unsubscribe."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    async def watch(self, debounce_s: float = 0.5, poll_s: float = 0.25) -> None:
        """Reload the live file when it changes, until cancelled (see policy_watch)."""
        from controller.policy_watch import PolicyWatcher

        await PolicyWatcher(self, debounce_s=debounce_s, poll_s=poll_s).run()

    # -- internals -----------------------------------------------------------------------

    def _notify(self, spec: PolicySpec, version: int) -> None:
        for callback in list(self._subscribers):
            try:
                callback(spec, version)
            except Exception:
                log.exception("policy subscriber %r failed on version %d", callback, version)

    def _load(self) -> ActivePolicy:
        latest = self._log.latest()
        if not self.path.exists():
            text = DEFAULT_POLICY_TEXT if latest is None else self._log.read_text(latest)
            write_atomically(self.path, text.encode("utf-8"))
            log.info("policy file %s created", self.path)
        text = self.path.read_text(encoding="utf-8")
        try:
            spec = validate_policy_text(text)
        except InvalidDocument as exc:
            if latest is None:
                raise
            self.last_file_error = exc.problems
            self.num_rejected_file_changes += 1
            log.error(
                "policy file %s is invalid, running kept version %d: %s", self.path, latest, exc
            )
            kept = self._log.read_text(latest)
            return ActivePolicy(latest, kept, validate_policy_text(kept))
        if latest is not None and self._log.read_text(latest) == text:
            return ActivePolicy(latest, text, spec)
        source = "default" if latest is None and text == DEFAULT_POLICY_TEXT else "file"
        record = self._log.append(text, source, self._clock())
        return ActivePolicy(record.version, text, spec)
