"""Tool requests and maths problems written in Russian, Ukrainian, Japanese, Korean and
Chinese (sources ``synthetic_foreign_tool`` and ``synthetic_foreign_math``; #17, fourth
follow-up). The tables are in ``foreign_tables.py``.

Every tool request is yielded as written and behind one opener of its language; every maths
problem ``NUM_PER_MATH_TOPIC`` times with other numbers. Groups: one written request (with
its opener variant; ``phrasing/tool-ru/git/2``) and one problem
(``phrasing/math-topic-ru/3``). Not whole tools: with a group per language and tool, the
held-out rule took Russian git and SQL, Ukrainian SQL and regular expressions, Chinese git
and bash out of training altogether (a split of 20% of ~35 groups), which is coverage the
source exists to give; the held-out figure of this source therefore measures requests of a
tool and language trained on (optimistic; the prompt files are the check). Own seeded
generator, and yielded after every other source, so the sources before them (and their
deduplication) do not move.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from policies.types import Task
from training.classifier.corpus import Example, user
from training.classifier.foreign_tables import MATH_TOPICS, TOOL_OPENERS, TOOL_REQUESTS

TOOL_SOURCE = "synthetic_foreign_tool"
MATH_SOURCE = "synthetic_foreign_math"
NUM_PER_MATH_TOPIC = 12


def foreign_examples(seed: int = 0) -> Iterator[Example]:
    rng = random.Random(seed)
    for language, tools in TOOL_REQUESTS.items():
        openers = TOOL_OPENERS[language]
        for tool, requests in tools.items():
            for index, text in enumerate(requests):
                group = f"phrasing/tool-{language}/{tool}/{index}"
                yield Example(user(text), Task.CODE, TOOL_SOURCE, group)
                opener = rng.choice(openers[1:])
                yield Example(user(opener + text), Task.CODE, TOOL_SOURCE, group)
    for language, problems in MATH_TOPICS.items():
        for index, problem in enumerate(problems):
            group = f"phrasing/math-topic-{language}/{index}"
            for _ in range(NUM_PER_MATH_TOPIC):
                text = problem.format(**values(rng))
                yield Example(user(text), Task.MATH, MATH_SOURCE, group)


def values(rng: random.Random) -> dict[str, int]:
    return {
        "a": rng.randint(2, 12), "b": rng.randint(2, 12), "c": rng.randint(13, 480),
        "d": rng.randint(2, 12), "p": rng.choice((5, 10, 12, 15, 20, 25, 30, 40)),
    }  # fmt: skip
