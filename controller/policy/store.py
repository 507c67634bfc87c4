"""The versioned policy store: the one place the running policy changes.

Every change (admin API, policy file edit, rollback) goes through ``validate_and_build``
once; an accepted text is kept as a numbered version (see ``versions``), mirrored to the live
policy file (both written atomically) and becomes the running policy, built object and all,
and subscribers are told. A text that cannot be built raises ``InvalidDocument`` and nothing
changes: versions, the file and the running policy stay as they were. Version numbers only
grow: rolling back to version 3 stores a new version whose text is version 3's. The ETag is
derived from the version number and the text's hash, so any accepted change changes it.

The store remembers the signature of its own last write of the live file, so the watcher
never takes that write for an operator's edit. Thread-safe: the admin API applies changes
on worker threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.policy.build import DEFAULT_BLOCK_SIZE, BuiltPolicy, validate_and_build
from controller.policy.document import DEFAULT_POLICY_TEXT, decode_policy
from controller.policy.files import FileSignature, remove_stale_temp_files, write_atomically
from controller.policy.running import RunningPolicy
from controller.policy.versions import VersionLog, text_sha256
from policies.model import PolicySpec
from policies.validation import InvalidDocument, Problem

log = logging.getLogger(__name__)

Subscriber = Callable[[RunningPolicy], None]


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
    text: str
    running: RunningPolicy

    @property
    def etag(self) -> str:
        return f'"v{self.running.version}-{text_sha256(self.text)[:16]}"'


def etag_matches(if_match: str, etag: str) -> bool:
    """RFC 9110 If-Match: ``*`` or a comma-separated list of strong ETags."""
    candidates = [c.strip() for c in if_match.split(",")]
    return "*" in candidates or etag in candidates


class PolicyStore:
    """Validated, built, versioned, atomically written policy with change subscriptions."""

    def __init__(
        self,
        path: Path,
        versions_dir: Path,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_versions: int = 200,
        clock: Callable[[], float] = time.time,
    ):
        self.path = path
        self._block_size = block_size
        self._log = VersionLog(versions_dir, max_versions)
        self._clock = clock
        self._lock = threading.RLock()
        self._subscribers: list[Subscriber] = []
        self.last_file_error: list[Problem] | None = None
        self.num_rejected_file_changes = 0
        # The live file as the store last wrote it (None: not written by this store yet).
        self.written: FileSignature | None = None
        remove_stale_temp_files(path.parent, lambda name: name == path.name)
        self._active = self._load()

    # -- reading -------------------------------------------------------------------------

    def current(self) -> tuple[int, str, PolicySpec]:
        active = self._active
        return active.running.version, active.text, active.running.spec

    def running(self) -> RunningPolicy:
        """The running policy (read on every request; replaced whole on every change)."""
        return self._active.running

    def etag(self) -> str:
        return self._active.etag

    def versions(self) -> list[dict[str, Any]]:
        """Every kept version, newest first; ``is_current`` marks the running one."""
        current = self._active.running.version
        return [{**r.as_dict(), "is_current": r.version == current} for r in self._log.records()]

    def version_text(self, version: int) -> str:
        if version not in self._log.numbers():
            raise UnknownVersion(f"policy version {version} is not kept; see GET versions")
        return self._log.read_text(version)

    def build(self, text: str) -> BuiltPolicy:
        """What ``apply`` would run for ``text``, without applying it; raises InvalidDocument."""
        return validate_and_build(text, block_size=self._block_size, base_dir=self.path.parent)

    # -- changing ------------------------------------------------------------------------

    def apply(self, text: str, if_match: str | None = None, source: str = "api") -> int:
        """Validate, build and activate ``text``; returns the running version number.

        Raises InvalidDocument (nothing changes) or PreconditionFailed. Applying the text
        that is already running is a no-op and returns the current version.
        """
        built = self.build(text)
        with self._lock:
            return self._activate(text, built, if_match, source)

    def apply_file_bytes(self, data: bytes, signature: FileSignature | None = None) -> int:
        """Apply the live file's contents, read with ``signature``; returns the running version.

        An invalid file is logged, counted and kept for the operator to fix (InvalidDocument
        is raised). Contents the file no longer holds (the store wrote it since the read)
        are not applied: the newer file is what counts.
        """
        try:
            text = decode_policy(data)
            built = self.build(text)
        except InvalidDocument as exc:
            with self._lock:
                self._file_rejected(exc, self._active.running.version)
            raise
        with self._lock:
            if signature is not None and not self._still_on_disk(signature):
                return self._active.running.version
            version = self._activate(text, built, None, "file")
            self.last_file_error = None
            return version

    def rollback(self, version: int, if_match: str | None = None) -> int:
        """Activate a kept version's text again, as a new version; returns its number."""
        text = self.version_text(version)
        return self.apply(text, if_match=if_match, source=f"rollback:{version}")

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(running)`` after every change; returns an unsubscribe."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    # -- internals -----------------------------------------------------------------------

    def _activate(self, text: str, built: BuiltPolicy, if_match: str | None, source: str) -> int:
        """Record, write and run ``built``; the caller holds the lock."""
        active = self._active
        if if_match is not None and not etag_matches(if_match, active.etag):
            raise PreconditionFailed(if_match, active.etag)
        if text == active.text:
            return active.running.version
        record = self._log.append(text, source, self._clock())
        self.written = write_atomically(self.path, text.encode("utf-8"))
        self.last_file_error = None  # the file now holds an accepted policy
        running = RunningPolicy.of(record.version, built)
        self._active = ActivePolicy(text, running)
        log.info(
            "policy version %d (%s) active (source: %s)", record.version, built.spec.kind, source
        )
        self._notify(running)  # under the lock: subscribers see versions in order
        return record.version

    def _still_on_disk(self, signature: FileSignature) -> bool:
        try:
            return FileSignature.of(self.path.stat(), self.path.read_bytes()) == signature
        except FileNotFoundError:
            return False

    def _file_rejected(self, exc: InvalidDocument, running_version: int) -> None:
        self.last_file_error = exc.problems
        self.num_rejected_file_changes += 1
        log.error("policy file %s rejected, version %d runs: %s", self.path, running_version, exc)

    def _notify(self, running: RunningPolicy) -> None:
        for callback in list(self._subscribers):
            try:
                callback(running)
            except Exception:
                log.exception(
                    "policy subscriber %r failed on version %d", callback, running.version
                )

    def _load(self) -> ActivePolicy:
        latest = self._log.latest()
        if not self.path.exists():
            text = DEFAULT_POLICY_TEXT if latest is None else self._log.read_text(latest)
            self.written = write_atomically(self.path, text.encode("utf-8"))
            log.info("policy file %s created", self.path)
        try:
            text = decode_policy(self.path.read_bytes())
            built = self.build(text)
        except InvalidDocument as exc:
            if latest is None:
                raise
            self._file_rejected(exc, latest)
            kept = self._log.read_text(latest)
            return ActivePolicy(kept, RunningPolicy.of(latest, self.build(kept)))
        if latest is not None and self._log.read_text(latest) == text:
            return ActivePolicy(text, RunningPolicy.of(latest, built))
        source = "default" if latest is None and text == DEFAULT_POLICY_TEXT else "file"
        record = self._log.append(text, source, self._clock())
        return ActivePolicy(text, RunningPolicy.of(record.version, built))
