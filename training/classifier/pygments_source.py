"""Source files in ~450 languages from Pygments' source distribution (``pygments==2.21.0``).

The sdist on PyPI ships the lexers' test material: ``tests/examplefiles/<lexer>/`` holds
real files (673 of them: Terraform, PowerShell, C#, Go, Swift, Kotlin, Lua, R, SQL,
Makefiles, YAML, Dockerfiles, shell sessions, stack traces, ...), ``tests/snippets/<lexer>/``
small inputs (836). Training reads ``examplefiles`` only; ``snippets`` are kept for the
evaluation (``classifier eval --prompts``) and never trained on. The wheel has neither, so the
sdist is fetched with pip (``fetch_sdist``; ``make install-test`` does it) and read straight
from the tarball. Pygments is BSD-2-Clause; the example files are test data shipped under it.

Language names come from the installed Pygments' lexer table (``get_all_lexers``): the
folder name is a lexer alias, mapped to the lexer's display name ("terraform" ->
"Terraform", "csharp" -> "C#").
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from training.classifier.corpus import MissingDataError

PYGMENTS_VERSION = "2.21.0"
SDIST_NAME = f"pygments-{PYGMENTS_VERSION}.tar.gz"
SDIST_SHA256 = "610ca751c9bc2492b38eb9a38a7fbc93edbbb2d7182edaf34e66ae493dee5c8c"
DEFAULT_SDIST_DIR = Path(".draftctl/data")
# Example files longer than this are cut: a request rarely pastes more.
MAX_FILE_CHARS = 3000


@dataclass(frozen=True)
class Sdist:
    """A pinned source distribution on PyPI that training reads data from."""

    package: str
    version: str
    file_name: str
    sha256: str


PYGMENTS_SDIST = Sdist("pygments", PYGMENTS_VERSION, SDIST_NAME, SDIST_SHA256)


@dataclass(frozen=True)
class SourceFile:
    """One file of the sdist's test material: its lexer alias, display name and text."""

    alias: str
    language: str
    path: str
    text: str


def sdist_path(folder: Path = DEFAULT_SDIST_DIR, sdist: Sdist = PYGMENTS_SDIST) -> Path:
    return folder / sdist.file_name


def fetch_sdist(folder: Path = DEFAULT_SDIST_DIR, sdist: Sdist = PYGMENTS_SDIST) -> Path:
    """The pinned sdist in ``folder`` (Pygments' unless ``sdist`` says otherwise), downloaded
    with pip (from PyPI) when absent."""
    path = sdist_path(folder, sdist)
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        requirement = f"{sdist.package}=={sdist.version}"
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                   ":all:", "-q", "-d", str(folder), requirement]  # fmt: skip
        result = subprocess.run(command, check=False, capture_output=True, text=True)
        if result.returncode or not path.is_file():
            raise MissingDataError(
                f"{path}: not found and `{' '.join(command)}` failed ({result.stderr.strip()}); "
                f"download the {sdist.package} sdist there by hand"
            )
    return path


def sdist_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lexer_names() -> dict[str, str]:
    """Every lexer alias (and the lowercased name) -> the lexer's display name."""
    from pygments.lexers import get_all_lexers

    names: dict[str, str] = {}
    for name, aliases, _, _ in get_all_lexers():
        for alias in (*aliases, name.lower()):
            names.setdefault(alias, name)
    return names


def source_files(
    path: Path, kind: str = "examplefiles", sha256: str | None = SDIST_SHA256
) -> Iterator[SourceFile]:
    """The files under ``tests/<kind>/`` of the sdist at ``path``, in name order.

    ``examplefiles``: whole files (``*.output`` token dumps skipped); ``snippets``: the
    ``---input---`` section of each snippet. Undecodable files are skipped. ``sha256``: what
    the tarball must hash to (None: not checked; tests use small tarballs of their own).
    """
    if not path.is_file():
        raise MissingDataError(
            f"{path}: not found; run `make install-test` or `python -c 'from "
            "training.classifier.pygments_source import fetch_sdist; fetch_sdist()'`"
        )
    if sha256 is not None and sdist_sha256(path) != sha256:
        raise MissingDataError(
            f"{path}: sha256 is not {sha256}; delete it and run `make install-test` (or "
            f"`pip download --no-deps --no-binary :all: pygments=={PYGMENTS_VERSION}`) again"
        )
    names = lexer_names()
    with tarfile.open(path, "r:gz") as archive:
        members = sorted(
            (m for m in archive.getmembers() if m.isfile() and f"/tests/{kind}/" in m.name),
            key=lambda m: m.name,
        )
        for member in members:
            parts = member.name.split("/")
            if len(parts) < 5 or member.name.endswith(".output"):
                continue
            handle = archive.extractfile(member)
            try:
                text = handle.read().decode("utf-8") if handle else ""
            except UnicodeDecodeError:
                continue
            if kind == "snippets":
                text = text.partition("---input---\n")[2].partition("\n---tokens---")[0]
            alias = parts[3]
            text = text.strip("\n")[:MAX_FILE_CHARS]
            if text.strip():
                yield SourceFile(alias, names.get(alias, alias), "/".join(parts[2:]), text)
