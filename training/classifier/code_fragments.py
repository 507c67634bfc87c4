"""Short pieces of real source files, bare, as code requests (source ``synthetic_fragment``).

Users paste a line or two of code with no word around it; the Pygments snippets that
``classifier eval --snippets`` scores are such pieces (median 39 characters, 2 lines), and
the ChatterBot corpus's short chat lines taught the model that a short text is chat
(docs/classifier.md, "Code fragments and calibration"). These fragments are cut from the
sdist's ``tests/examplefiles`` (the files training already reads as ``pygments``), never
from ``tests/snippets``, so the snippets stay an evaluation set training never reads. The
group is the file's language, as for ``pygments``, so both sit on the same side of the split.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from policies.types import Task
from training.classifier.corpus import Example, user
from training.classifier.pygments_source import SourceFile

SOURCE = "synthetic_fragment"
NUM_PER_FILE = 4
# Lines per fragment, drawn uniformly from this tuple: mostly one to three lines, some longer.
NUM_LINES = (1, 1, 1, 2, 2, 3, 4, 6, 10, 16)
MAX_FRAGMENT_CHARS = 600
MIN_FRAGMENT_CHARS = 3


def fragment_examples(files: Sequence[SourceFile], seed: int = 0) -> Iterator[Example]:
    """``NUM_PER_FILE`` fragments of each file, half as completions prompts and half as a
    chat message, seeded (own generator, so the other generated sources do not move)."""
    rng = random.Random(seed)
    for source in files:
        lines = source.text.split("\n")
        for _ in range(NUM_PER_FILE):
            start = rng.randrange(len(lines))
            piece = "\n".join(lines[start : start + rng.choice(NUM_LINES)]).strip()
            if len(piece) < MIN_FRAGMENT_CHARS:
                continue
            text = piece[:MAX_FRAGMENT_CHARS]
            body = {"prompt": text} if rng.random() < 0.5 else user(text)
            yield Example(body, Task.CODE, SOURCE, f"pygments/{source.alias}")
