"""The trace every policy replays: phases of fixed concurrency and task mix, fixed requests.

A phase is closed-loop: ``concurrency`` clients, each sending its next request when the last
one finished, until the phase's ``num_requests`` are done; then the next phase starts. Each
request (its task, prompt, output length and, in synthetic mode, its acceptance draws) is a
pure function of the seed and its key, so every policy serves exactly the same requests.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policies.types import Task

# 1 -> 64 -> 8 clients, math-heavy -> mixed -> chat-heavy (issue #13's trace).
DEFAULT_PHASES = (
    "math:1:8:math=0.8,code=0.1,chat=0.1;"
    "mixed:64:256:math=0.4,code=0.2,chat=0.4;"
    "chat:8:48:math=0.1,code=0.1,chat=0.8"
)


@dataclass(frozen=True)
class Phase:
    name: str
    concurrency: int
    num_requests: int
    mix: dict[Task, float]


@dataclass(frozen=True)
class Job:
    key: str  # the request id and the synthetic acceptance key
    task: Task
    prompt_ids: tuple[int, ...]
    max_new_tokens: int


def parse_phases(text: str, scale: float = 1.0) -> list[Phase]:
    """``NAME:CONCURRENCY:REQUESTS:task=share,...;...``; ``scale`` multiplies the requests."""
    phases = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        try:
            name, concurrency, requests, mix_text = item.split(":")
            mix = {Task(t): float(s) for t, s in (p.split("=") for p in mix_text.split(","))}
        except ValueError as exc:
            raise ValueError(f"phase {item!r}: expected NAME:C:N:task=share,... ({exc})") from None
        count = max(int(concurrency), round(int(requests) * scale))
        phases.append(Phase(name, int(concurrency), count, mix))
    if not phases:
        raise ValueError("no phases given")
    return phases


def build_jobs(
    phases: Sequence[Phase],
    seed: int,
    prompt_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
    prompt_for: Callable[[random.Random, Task, int], list[int]],
) -> list[list[Job]]:
    """The requests of each phase; ``prompt_for(rng, task, length)`` makes a prompt."""
    out = []
    for p, phase in enumerate(phases):
        jobs = []
        for i in range(phase.num_requests):
            key = f"p{p}-r{i}"
            rng = random.Random(f"{seed}:{key}")
            task = rng.choices(list(phase.mix), weights=list(phase.mix.values()))[0]
            prompt = prompt_for(rng, task, rng.randint(*prompt_tokens))
            jobs.append(Job(key, task, tuple(prompt), rng.randint(*output_tokens)))
        out.append(jobs)
    return out


def overall_mix(phases: Sequence[Phase]) -> dict[Task, float]:
    """The task mix of the whole trace, weighted by requests (a fleet's global mix)."""
    total = sum(p.num_requests for p in phases)
    mix = {task: 0.0 for task in Task}
    for phase in phases:
        for task, share in phase.mix.items():
            mix[task] += share * phase.num_requests / total
    return mix
