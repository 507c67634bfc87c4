"""Watch the live policy file and hand an operator's edits to the store.

Polling, not inotify: it works the same on every filesystem, in containers and on bind
mounts, and a policy file is tiny. Each poll reads the file's signature: mtime and size
from one ``stat``, plus a hash of the contents when those changed or the mtime is younger
than ``_FRESH_NS`` (a same-size edit inside one mtime tick is still seen; an idle daemon
does not read and hash the file four times a second). A change is applied only after the
signature has stayed the same for ``debounce_s``: editors that truncate then write, or write
a temp file then rename, settle first. The store's own writes (after an admin API change or
a rollback) carry the signature the store recorded and are not edits: they are neither
validated again nor applied. An invalid file is logged and counted once per distinct
content, and the running policy stays. Polls run on a worker thread, so reading, parsing
and building a file never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable

from controller.policy.files import FileSignature
from controller.policy.store import PolicyStore
from policies.validation import InvalidDocument

log = logging.getLogger(__name__)

# A file modified less than this long ago (wall clock) is read and hashed on every poll.
_FRESH_NS = 2_000_000_000


class PolicyWatcher:
    """Debounced poller feeding file edits to ``PolicyStore.apply_file_bytes``."""

    def __init__(
        self,
        store: PolicyStore,
        *,
        debounce_s: float = 0.5,
        poll_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ):
        if debounce_s < 0 or poll_s <= 0:
            raise ValueError(f"need debounce_s >= 0 and poll_s > 0, got {debounce_s}, {poll_s}")
        self._store = store
        self._debounce_s = debounce_s
        self._poll_s = poll_s
        self._clock = clock
        self._seen, self._data = self._read(None)
        self._changed_at: float | None = None
        self.num_reloads = 0
        self.num_invalid = 0

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.to_thread(self.poll_once)
            await asyncio.sleep(self._poll_s)

    def poll_once(self) -> None:
        """One poll: note a change, or apply it once it has settled for ``debounce_s``."""
        now = self._clock()
        signature, data = self._read(self._seen)
        if signature != self._seen:
            self._seen, self._data = signature, data
            # The store's own write replaces whatever edit was pending: it is the file now.
            is_own_write = signature is not None and signature == self._store.written
            self._changed_at = None if is_own_write else now
            return
        if self._changed_at is None or now - self._changed_at < self._debounce_s:
            return
        self._changed_at = None
        if self._data is None or signature is None:
            log.warning("policy file %s is missing; the running policy stays", self._store.path)
            return
        self._reload(self._data, signature)

    def _reload(self, data: bytes, signature: FileSignature) -> None:
        try:
            before = self._store.current()[0]
            version = self._store.apply_file_bytes(data, signature)
        except InvalidDocument:
            self.num_invalid += 1  # apply_file_bytes logged the problems
            return
        if version != before:
            self.num_reloads += 1

    def _read(self, seen: FileSignature | None) -> tuple[FileSignature | None, bytes | None]:
        """The file's signature and bytes; ``seen`` and no bytes if it cannot have changed."""
        path = self._store.path
        try:
            stat = path.stat()
            if (
                seen is not None
                and seen.matches(stat)
                and time.time_ns() - stat.st_mtime_ns > _FRESH_NS
            ):
                return seen, None
            data = path.read_bytes()
        except FileNotFoundError:
            return None, None
        digest = hashlib.sha256(data).hexdigest()
        return FileSignature(stat.st_mtime_ns, stat.st_size, digest), data
