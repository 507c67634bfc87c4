"""Numbered policy versions on disk, each written atomically.

Layout of ``versions_dir``::

    v000007.yaml   version 7's text, byte for byte as accepted
    v000007.json   {"version": 7, "created_s": ..., "source": "api", "sha256": ...}

The YAML is written before its JSON sidecar, so a crash between the two leaves a version
without metadata; loading treats that as a version of unknown origin rather than losing it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.policy.files import remove_stale_temp_files, write_atomically

log = logging.getLogger(__name__)

_VERSION_FILE = re.compile(r"^v(\d{6,})\.yaml$")
_VERSION_OR_SIDECAR = re.compile(r"^v\d{6,}\.(yaml|json)$")


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class VersionRecord:
    """One stored version's metadata (the text lives next to it)."""

    version: int
    created_s: float
    source: str
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "created_s": self.created_s,
            "source": self.source,
            "sha256": self.sha256,
        }


class VersionLog:
    """Append-only numbered versions in one directory, oldest pruned past ``max_versions``."""

    def __init__(self, versions_dir: Path, max_versions: int):
        if max_versions < 1:
            raise ValueError(f"max_versions must be >= 1, got {max_versions}")
        self._dir = versions_dir
        self._max_versions = max_versions
        self._dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_files(self._dir, lambda name: bool(_VERSION_OR_SIDECAR.match(name)))

    def numbers(self) -> list[int]:
        found = (_VERSION_FILE.match(p.name) for p in self._dir.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> int | None:
        numbers = self.numbers()
        return numbers[-1] if numbers else None

    def read_text(self, version: int) -> str:
        return self._yaml_path(version).read_text(encoding="utf-8")

    def record(self, version: int) -> VersionRecord:
        try:
            meta = json.loads(self._json_path(version).read_text(encoding="utf-8"))
            return VersionRecord(
                version, float(meta["created_s"]), str(meta["source"]), str(meta["sha256"])
            )
        except (OSError, ValueError, KeyError, TypeError):
            text = self.read_text(version)
            mtime = self._yaml_path(version).stat().st_mtime
            return VersionRecord(version, mtime, "unknown", text_sha256(text))

    def records(self) -> list[VersionRecord]:
        """Every kept version, newest first."""
        return [self.record(n) for n in reversed(self.numbers())]

    def append(self, text: str, source: str, created_s: float) -> VersionRecord:
        version = (self.latest() or 0) + 1
        record = VersionRecord(version, created_s, source, text_sha256(text))
        write_atomically(self._yaml_path(version), text.encode("utf-8"))
        meta = json.dumps(record.as_dict(), indent=1).encode("utf-8")
        write_atomically(self._json_path(version), meta)
        self._prune()
        return record

    def _prune(self) -> None:
        numbers = self.numbers()
        for version in numbers[: max(0, len(numbers) - self._max_versions)]:
            self._json_path(version).unlink(missing_ok=True)
            self._yaml_path(version).unlink(missing_ok=True)
            log.debug("pruned policy version %d", version)

    def _yaml_path(self, version: int) -> Path:
        return self._dir / f"v{version:06d}.yaml"

    def _json_path(self, version: int) -> Path:
        return self._dir / f"v{version:06d}.json"
