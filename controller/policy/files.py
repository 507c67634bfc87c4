"""Policy files on disk: atomic writes that keep the file's mode, and a file's signature.

A write goes through a hidden temp file next to its target (``.<name>.<12 hex>.tmp``); one
left behind by a process killed mid-write is removed at the next start
(``remove_stale_temp_files``) once it is older than any write can take.

The signature (mtime, size, SHA-256) is how the watcher tells an edit from an unchanged
file, and how the store tells the watcher which signature is its own write.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# What a file created by open() gets before the umask; mkstemp's 0600 would hide the policy
# from the other users and tools that read it.
_NEW_FILE_MODE = 0o666
_TEMP_FILE = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{12}\.tmp$")
# A temp file this old is no write in progress (one takes milliseconds): another process
# sharing the directory may be mid-write, so younger ones are left alone.
STALE_TEMP_AGE_S = 60.0


@dataclass(frozen=True)
class FileSignature:
    mtime_ns: int
    size_bytes: int
    sha256: str

    @classmethod
    def of(cls, status: os.stat_result, data: bytes) -> FileSignature:
        return cls(status.st_mtime_ns, status.st_size, hashlib.sha256(data).hexdigest())

    def matches(self, status: os.stat_result) -> bool:
        """Whether ``status`` (a fresh stat of the file) can still be this version of it."""
        return (status.st_mtime_ns, status.st_size) == (self.mtime_ns, self.size_bytes)


def write_atomically(path: Path, data: bytes) -> FileSignature:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a mix.

    Temp file in the same directory, fsync, rename over the target, then fsync the directory
    so the rename itself survives a crash. The new file keeps the old one's permission bits
    (a new file gets 0666 less the umask). Returns the written file's signature.
    """
    tmp_path = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"  # _TEMP_FILE
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _NEW_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as tmp:
            _keep_mode(path, tmp.fileno())
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
            written = os.fstat(tmp.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return FileSignature.of(written, data)


def _keep_mode(path: Path, fd: int) -> None:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return
    os.fchmod(fd, mode)


def remove_stale_temp_files(
    directory: Path,
    is_target: Callable[[str], bool],
    min_age_s: float = STALE_TEMP_AGE_S,
) -> list[Path]:
    """Delete the temp files that writes of ``is_target`` files left in ``directory``.

    Only this module's temp names whose target name ``is_target`` accepts, and only those
    older than ``min_age_s``; returns what was removed.
    """
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return removed
    for entry in entries:
        found = _TEMP_FILE.match(entry.name)
        if found is None or not is_target(found.group("target")):
            continue
        try:
            if now - entry.lstat().st_mtime < min_age_s or not entry.is_file():
                continue
            entry.unlink()
        except FileNotFoundError:
            continue
        log.info("removed %s, left by a write that never finished", entry)
        removed.append(entry)
    return removed
