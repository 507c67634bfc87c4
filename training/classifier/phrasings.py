"""Requests written the way people ask: code in any language, maths in any wording (#17).

The first classifier learnt the style of its sources (Python, English competition maths) and
read nearly everything else as chat. These generators put real material and hand-written
phrasings (``phrasing_tables.py``, ``math_tables.py``) together, seeded, labelled by what the
answer will be:

- ``pygments``: a real source file of one of ~450 languages as a completions prompt (code);
- ``synthetic_paste``: a piece of such a file pasted into a request to fix, explain, convert
  or speed it up, in eleven human languages (code: the answer quotes and fixes the code);
- ``synthetic_code_request``: "write a {language} {thing} to {task}" with MBPP's tasks in ~60
  languages and frameworks, tool tasks (git, shell, Docker, Kubernetes, CI, Terraform, CSS,
  regular expressions, SQL, spreadsheets, ...), and requests written in eight other languages;
- ``synthetic_language_chat``: questions that name a language but want prose (chat);
- ``synthetic_chat_request``: short prose requests (writing, advice, explanations, travel,
  translation) in ten human languages, so that shortness is not a cue for code or maths;
- ``synthetic_math_words``: maths in ten human languages (rates, fractions, averages,
  statistics, probability, expected value, proofs), and GSM8K problems behind casual prefixes;
- ``synthetic_preamble``: any single-turn request behind a system prompt that may not match it;
- ``synthetic_follow_up``: a follow-up to a code answer ("now do the same in Go") or to a
  worked maths answer ("what if it were 12?"), and a generated request of another task
  after such an answer ("Thanks! Unrelated: write a limerick about ...").

Every example's group is its template (or the source file's language), so the held-out split
holds out whole phrasings and whole languages. Histories and preambled requests come from
the same side of the split as the example. All are reported apart from the real sources.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from policies.types import Task
from training.classifier.corpus import Example, read_jsonl, user
from training.classifier.math_tables import (
    EXPRESSIONS,
    MATH_TEMPLATES,
    PROOF_REQUESTS,
    PROOF_STATEMENTS,
)
from training.classifier.phrasing_tables import (
    CASUAL_PREFIXES,
    CHAT_REQUESTS,
    CHAT_WORDS,
    CODE_FOLLOW_UPS,
    CODE_REQUESTS,
    FOREIGN_CODE_REQUESTS,
    LANGUAGE_CHAT,
    LANGUAGES,
    MATH_FOLLOW_UPS,
    PASTE_REQUESTS,
    SWITCH_OPENERS,
    SYSTEM_PROMPTS,
    THINGS,
    TOOL_REQUESTS,
    TOOL_TASKS,
)
from training.classifier.pygments_source import SourceFile
from training.classifier.split import is_held_out

MBPP_TASK = re.compile(
    r"^(?:write|create|design)\s+an?\s+(?:python\s+)?(?:function|program|method)\s+"
    r"(?:to|that|which)\s+(.+?)\.?\s*$",
    re.I,
)
GSM8K_CALCULATION = re.compile(r"<<[^>]*>>")
NUM_PER_MATH_TEMPLATE = 30
NUM_PER_CODE_TEMPLATE = 120
# Per template of a code request in another human language. 30 until #17's follow-up left
# each such language with about twice as many maths as code requests (Russian: 169 maths,
# 87 code, 33 chat after deduplication), and requests in those scripts read as maths.
NUM_PER_FOREIGN_CODE_TEMPLATE = 60
NUM_PREAMBLES = 1500
NUM_FOLLOW_UPS_PER_TEMPLATE = 40
NUM_PER_CHAT_TEMPLATE = 100
NUM_SWITCHES = 400


def phrasing_examples(
    shared: Path, files: Sequence[SourceFile], singles: Sequence[Example], seed: int = 0
) -> Iterator[Example]:
    """All generated examples; ``singles`` are single-turn requests of the public sets and
    ShareGPT, put behind system prompts."""
    rng = random.Random(seed)
    mbpp_rows = list(read_jsonl(shared / "mbpp" / "mbpp.jsonl"))
    requests = {
        Task.CODE: [*code_requests(mbpp_rows, rng), *tool_requests(rng)],
        Task.MATH: list(math_requests(rng)),
        Task.CHAT: [*chat_requests(rng), *language_chat(rng)],
    }
    yield from source_file_examples(files, rng)
    for examples in requests.values():
        yield from examples
    yield from casual_math(shared, rng)
    yield from preambles([*singles, *requests[Task.CHAT]], rng)
    histories = history_pools(shared, mbpp_rows)
    yield from follow_ups(histories, rng)
    yield from switches(histories, requests, rng)


def language_name(rng: random.Random) -> str:
    names = rng.choice(LANGUAGES)
    return names[0] if rng.random() < 0.6 else rng.choice(names)


def source_file_examples(files: Sequence[SourceFile], rng: random.Random) -> Iterator[Example]:
    """Each file as a completions prompt, and two pieces of it pasted into requests."""
    for source in files:
        group = f"pygments/{source.alias}"
        yield Example({"prompt": source.text}, Task.CODE, "pygments", group)
        lines = source.text.split("\n")
        for _ in range(2):
            start = rng.randrange(len(lines))
            code = "\n".join(lines[start : start + rng.randint(3, 40)]).strip("\n") or source.text
            template = rng.choice(PASTE_REQUESTS)
            fence = "```" + (source.alias if rng.random() < 0.5 else "")
            text = template.format(
                lang=source.language, lang2=language_name(rng), code=code, fence=fence
            )
            yield Example(user(text), Task.CODE, "synthetic_paste", group)


def code_requests(mbpp_rows: Sequence[dict[str, Any]], rng: random.Random) -> Iterator[Example]:
    """MBPP's tasks (training side only) asked for in many languages, then requests written
    in other human languages."""
    tasks = [
        match.group(1)
        for row in mbpp_rows
        if not is_held_out(f"mbpp/{row['task_id']}")
        for match in [MBPP_TASK.match(row["text"].strip())]
        if match
    ]
    for index, template in enumerate(CODE_REQUESTS):
        group = f"phrasing/code/{index}"
        for _ in range(NUM_PER_CODE_TEMPLATE):
            text = template.format(
                lang=language_name(rng), thing=rng.choice(THINGS), task=rng.choice(tasks)
            )
            yield Example(user(casual(text, rng)), Task.CODE, "synthetic_code_request", group)
    for language, (templates, foreign_tasks) in FOREIGN_CODE_REQUESTS.items():
        for index, template in enumerate(templates):
            group = f"phrasing/code-{language}/{index}"
            for _ in range(NUM_PER_FOREIGN_CODE_TEMPLATE):
                text = template.format(lang=language_name(rng), task=rng.choice(foreign_tasks))
                yield Example(user(text), Task.CODE, "synthetic_code_request", group)


def tool_requests(rng: random.Random) -> Iterator[Example]:
    for index, template in enumerate(TOOL_REQUESTS):
        group = f"phrasing/tool/{index}"
        for tool, tasks in TOOL_TASKS.items():
            for task in rng.sample(tasks, min(3, len(tasks))):
                article = "" if tool.startswith(("a ", "an ")) else "a "
                tool_a = tool if not article else f"{article}{tool} command"
                text = template.format(tool=tool.removeprefix("a "), tool_a=tool_a, task=task)
                yield Example(user(casual(text, rng)), Task.CODE, "synthetic_code_request", group)


def chat_requests(rng: random.Random) -> Iterator[Example]:
    """Short prose requests (writing, advice, explanations, travel, translation) in ten
    human languages."""
    for language, templates in CHAT_REQUESTS.items():
        count = NUM_PER_CHAT_TEMPLATE
        for index, template in enumerate(templates):
            group = f"phrasing/chat-{language}/{index}"
            for _ in range(count):
                values = {key: rng.choice(words) for key, words in CHAT_WORDS.items()}
                values["concept2"] = rng.choice(CHAT_WORDS["concept"])
                values["a"] = str(rng.randint(2, 7))
                text = casual(template.format(**values), rng)
                yield Example(user(text), Task.CHAT, "synthetic_chat_request", group)


def language_chat(rng: random.Random) -> Iterator[Example]:
    for index, template in enumerate(LANGUAGE_CHAT):
        group = f"phrasing/language-chat/{index}"
        for _ in range(25):
            text = template.format(lang=language_name(rng), lang2=language_name(rng))
            yield Example(user(text), Task.CHAT, "synthetic_language_chat", group)


def math_requests(rng: random.Random) -> Iterator[Example]:
    for language, templates in MATH_TEMPLATES.items():
        for index, template in enumerate(templates):
            group = f"phrasing/math-{language}/{index}"
            for _ in range(NUM_PER_MATH_TEMPLATE):
                text = template.format(**math_values(rng))
                yield Example(user(casual(text, rng)), Task.MATH, "synthetic_math_words", group)
    for index, template in enumerate(PROOF_REQUESTS):
        for statement in PROOF_STATEMENTS:
            text = template.format(statement=statement)
            group = f"phrasing/proof/{index}"
            yield Example(user(text), Task.MATH, "synthetic_math_words", group)


def math_values(rng: random.Random) -> dict[str, Any]:
    values = [rng.randint(1, 99) for _ in range(rng.randint(4, 8))]
    return {
        "a": rng.randint(2, 12), "b": rng.randint(2, 12), "c": rng.randint(13, 480),
        "d": rng.randint(2, 12), "p": rng.choice((5, 10, 12, 15, 20, 25, 30, 40, 75)),
        "xs": ", ".join(str(value) for value in values),
        "expr": rng.choice(EXPRESSIONS),
    }  # fmt: skip


def casual(text: str, rng: random.Random) -> str:
    """Sometimes all lowercase without the final full stop, as people type in a hurry."""
    return text.lower().rstrip(".") if rng.random() < 0.2 else text


def casual_math(shared: Path, rng: random.Random) -> Iterator[Example]:
    """GSM8K training problems behind a casual prefix (the problem's own group)."""
    rows = [row for row in read_jsonl(shared / "gsm8k" / "train.jsonl")]
    for row in rng.sample(rows, 1200):
        text = rng.choice(CASUAL_PREFIXES) + casual(row["question"], rng)
        yield Example(user(text), Task.MATH, "synthetic_math_words", row["question"])


def preambles(singles: Sequence[Example], rng: random.Random) -> Iterator[Example]:
    """Single-turn requests of every task behind a system prompt (their own group): the
    preamble does not decide, the request does."""
    for request in rng.sample(list(singles), min(NUM_PREAMBLES, len(singles))):
        system = {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}
        body = {"messages": [system, *request.body["messages"]]}
        yield Example(body, request.task, "synthetic_preamble", request.group)


History = tuple[str, str, str]  # (group, question, answer)


def history_pools(
    shared: Path, mbpp_rows: Sequence[dict[str, Any]]
) -> dict[Task, dict[bool, list[History]]]:
    """Per task and split side: MBPP tasks with their reference code, GSM8K problems with
    their worked answers."""
    code = [
        (f"mbpp/{row['task_id']}", row["text"], f"```python\n{row['code']}\n```")
        for row in mbpp_rows
    ]
    maths = [
        (row["question"], row["question"], GSM8K_CALCULATION.sub("", row["answer"]))
        for row in read_jsonl(shared / "gsm8k" / "train.jsonl")
    ]
    return {
        task: {side: [h for h in histories if is_held_out(h[0]) == side] for side in (False, True)}
        for task, histories in ((Task.CODE, code), (Task.MATH, maths))
    }


def conversation(history: History, text: str) -> dict[str, Any]:
    _, question, answer = history
    return {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": text},
        ]
    }


def follow_ups(
    histories: dict[Task, dict[bool, list[History]]], rng: random.Random
) -> Iterator[Example]:
    """Follow-ups after an MBPP task and its reference code ("now do the same in Go"), or a
    GSM8K problem and its worked answer ("what if it were 12?"): they keep the task. Each
    history comes from the same side of the split as the template."""
    for task, templates in ((Task.CODE, CODE_FOLLOW_UPS), (Task.MATH, MATH_FOLLOW_UPS)):
        for index, template in enumerate(templates):
            group = f"phrasing/follow-up-{task}/{index}"
            pool = histories[task][is_held_out(group)]
            for _ in range(NUM_FOLLOW_UPS_PER_TEMPLATE):
                text = template.format(lang=language_name(rng), **math_values(rng))
                body = conversation(rng.choice(pool), text)
                yield Example(body, task, "synthetic_follow_up", group)


def switches(
    histories: dict[Task, dict[bool, list[History]]],
    requests: dict[Task, list[Example]],
    rng: random.Random,
) -> Iterator[Example]:
    """A generated request of another task after a code or maths history, sometimes opened
    with "Thanks! Unrelated: ": the request decides. Its group is the request's."""
    for history_task, pools in histories.items():
        for task, examples in requests.items():
            if task == history_task:
                continue
            for request in rng.sample(examples, min(NUM_SWITCHES, len(examples))):
                text = rng.choice(SWITCH_OPENERS) + request.body["messages"][-1]["content"]
                body = conversation(rng.choice(pools[is_held_out(request.group)]), text)
                yield Example(body, task, "synthetic_follow_up", request.group)
