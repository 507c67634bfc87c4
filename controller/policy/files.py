"""Policy files on disk: atomic writes that keep the file's mode, and a file's signature.

The signature (mtime, size, SHA-256) is how the watcher tells an edit from an unchanged
file, and how the store tells the watcher which signature is its own write.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

# What a file created by open() gets before the umask; mkstemp's 0600 would hide the policy
# from the other users and tools that read it.
_NEW_FILE_MODE = 0o666


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
    tmp_path = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
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
