"""Real chat in ~30 human languages from the ChatterBot corpus (``chatterbot-corpus==1.3.3``).

The corpus is a set of YAML files, one per language and topic (``data/<language>/<topic>.yml``:
greetings, food, history, science, computers, ...), each a list of short conversations whose
lines alternate between the user and the bot. It is the only real (not generated) text in
Ukrainian, Russian, Korean and Japanese available offline here besides a few dozen ShareGPT
turns, so it teaches that a request in those scripts is not maths or code by its letters
alone (#17: generated requests in those languages were mostly maths and code, and their
chat read as code). Every user line is ``chat``: the bot's answers are a sentence of prose
(the English ``coding.yml`` asks *about* languages, "What is Python?", and is answered in
words). Every user line is a single-turn request: with the bot's lines as history, the
hand-written follow-ups that keep a maths or code task ("now 2/3 of 81 please") read as
chat (3 of 20 multi-turn prompts lost in a trial). The group is the file, so the held-out
split holds out whole topics of each language.

The sdist is fetched with pip like Pygments' (``pygments_source.fetch_sdist``) into
``.draftctl/data/`` and read from the tarball. ChatterBot corpus: BSD-3-Clause.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from policies.types import Task
from training.classifier.corpus import Example, MissingDataError, user
from training.classifier.pygments_source import DEFAULT_SDIST_DIR, Sdist, fetch_sdist, sdist_sha256

SDIST = Sdist(
    "chatterbot-corpus",
    "1.3.3",
    "chatterbot_corpus-1.3.3.tar.gz",
    "615b5c4c605154f60ae51d03ed918ed92e9d32bc2b144b759bbc64ecdbe18481",
)
SOURCE = "chatterbot"


def chatterbot_examples(folder: Path = DEFAULT_SDIST_DIR) -> Iterator[Example]:
    """Every user line of the corpus as a chat request, file by file in name order."""
    path = fetch_sdist(folder, SDIST)
    if sdist_sha256(path) != SDIST.sha256:
        raise MissingDataError(f"{path}: sha256 is not {SDIST.sha256}; delete it and train again")
    with tarfile.open(path, "r:gz") as archive:
        members = sorted(
            (m for m in archive.getmembers() if m.isfile() and m.name.endswith(".yml")),
            key=lambda m: m.name,
        )
        for member in members:
            parts = member.name.split("/")
            if len(parts) != 5 or parts[2] != "data":
                continue
            handle = archive.extractfile(member)
            if handle is None:
                continue
            document = yaml.safe_load(handle.read().decode("utf-8-sig"))
            group = f"{SOURCE}/{parts[3]}/{parts[4]}"
            yield from conversation_examples(document, group)


def conversation_examples(document: Any, group: str) -> Iterator[Example]:
    """The user lines (even positions) of each conversation of one corpus file, each as a
    single-turn request."""
    conversations = document.get("conversations") if isinstance(document, dict) else None
    for lines in conversations or []:
        for line in (lines if isinstance(lines, list) else [])[::2]:
            if str(line).strip():
                yield Example(user(str(line)), Task.CHAT, SOURCE, group)
