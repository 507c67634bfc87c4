"""Topic switches: a self-contained request asked after a conversation about something else.

ShareGPT conversations rarely change subject, so a model trained on them learns that the
context decides ("continue" after code is code) and then misreads "now write a poem" or
"solve 3x + 7 = 22" asked after a code answer as code. These examples put the single-turn
request of a labelled source (a GSM8K problem, an MBPP task, a clean ShareGPT chat first
turn, ...) after a ShareGPT conversation *with its answer* of another label. The request's own
label stands: it is self-contained, so the answer follows it, not the history.

They are reported as ``synthetic_switch``, apart from the real sources. The example's group
is the request's group, and only conversations from the same side of the split are used as
history, so held-out switches are built entirely from held-out material.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from policies.types import Task
from training.classifier.corpus import Example
from training.classifier.split import is_held_out

NUM_PER_TASK = 1000
# The label of the history a request of each task is put after: always a different one.
HISTORY_TASKS = {
    Task.MATH: (Task.CODE, Task.CHAT),
    Task.CODE: (Task.CHAT,),
    Task.CHAT: (Task.CODE,),
}


def topic_switches(examples: Sequence[Example], seed: int = 0) -> Iterator[Example]:
    """``NUM_PER_TASK`` switch examples per task, drawn with a seeded generator."""
    rng = random.Random(seed)
    histories = _histories(examples)
    for task, history_tasks in HISTORY_TASKS.items():
        requests = [e for e in examples if e.task == task and is_single_turn(e)]
        for request in rng.sample(requests, min(NUM_PER_TASK, len(requests))):
            side = is_held_out(request.group)
            pool = histories[(rng.choice(history_tasks), side)]
            if pool:
                history = rng.choice(pool)
                messages = [*history, *request.body["messages"]]
                yield Example({"messages": messages}, task, "synthetic_switch", request.group)


def _histories(examples: Sequence[Example]) -> dict[tuple[Task, bool], list[list[dict[str, str]]]]:
    """ShareGPT conversations ending with their labelled answer, by label and split side."""
    pools: dict[tuple[Task, bool], list[list[dict[str, str]]]] = {
        (task, side): [] for task in Task for side in (False, True)
    }
    for example in examples:
        if example.answer:
            history = [*example.body["messages"], {"role": "assistant", "content": example.answer}]
            pools[(example.task, is_held_out(example.group))].append(history)
    return pools


def is_single_turn(example: Example) -> bool:
    """A chat request of one user message (ShareGPT first turns with no history included)."""
    messages = example.body.get("messages")
    return isinstance(messages, list) and len(messages) == 1 and messages[0]["role"] == "user"
