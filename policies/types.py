"""The vocabulary shared by every policy: tasks, observations and decisions.

Glossary: k (``spec_tokens``) is the number of drafted tokens verified per step
(vLLM ``num_speculative_tokens``; SGLang ``--speculative-num-draft-tokens`` = k + 1).
k = 0 means drafting is off. Accept length counts the bonus token: a step that accepts
no draft still yields 1 token.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt


class Task(StrEnum):
    MATH = "math"
    CODE = "code"
    CHAT = "chat"


TASKS: tuple[Task, ...] = (Task.MATH, Task.CODE, Task.CHAT)
TASK_INDEX: dict[Task, int] = {task: i for i, task in enumerate(TASKS)}  # a task's row in arrays


def max_spec_tokens(block_size: int) -> int:
    """The largest k a draft of ``block_size`` can propose (the block's first slot is the
    anchor token, so k <= block_size - 1)."""
    return block_size - 1


@dataclass(frozen=True)
class PoolView:
    """What a policy may know about one backend: a pool of servers started with a fixed k, or
    an engine that sets k per request (``is_adjustable``; then ``spec_tokens`` is the largest
    k it can serve)."""

    name: str
    spec_tokens: int
    block_size: int
    num_inflight: int
    is_healthy: bool = True
    is_adjustable: bool = False
    # Observed time per output token at the pool's current load (None until measured).
    tpot_s: float | None = None
    # Observed mean accept length for the request's task on this pool (None until measured).
    accept_length: float | None = None
    # Healthy servers in the pool (load spill compares in-flight requests per server).
    num_servers: int = 1

    @property
    def load_per_server(self) -> float:
        return self.num_inflight / max(1, self.num_servers)


# One value per drafted position, as a list or (from an engine's tensors) a numpy array.
PositionValues = Sequence[float] | npt.NDArray[np.float64]


class StepRow(NamedTuple):
    """One running request as a step policy sees it before an engine step (the batch planner
    ``policies.batch_width.BatchWidth`` and every ``policies.baselines`` step policy).

    ``accept_lengths`` and ``spec_tokens`` are the request's whole history, aligned (the
    engine's own lists: read during the call, never kept or changed): the accept length of
    every verify step so far, bonus included, and the k that step ran with after the engine's
    clamp. ``max_spec_tokens``: the most this row can verify in the coming step (the block's
    and what the request can still emit, minus one). A row's task is read when it is first seen.
    As the lists grow in place, an engine may build a request's row once and pass it again at
    every step until its ceiling changes (the request's last few steps).
    """

    row_id: Hashable
    task: Task
    accept_lengths: Sequence[int]
    spec_tokens: Sequence[int]
    max_spec_tokens: int
    # Top-1 probability of the draft distribution at drafted positions 1, 2, ... of this
    # step's block; None when the engine does not expose it.
    draft_confidence: PositionValues | None = None


class StepCost(Protocol):
    """Seconds for one step of ``batch_size`` requests each verifying ``spec_tokens`` drafts."""

    def step_time_s(self, batch_size: int, spec_tokens: int) -> float: ...


@dataclass(frozen=True)
class Observation:
    """Everything a policy sees for one decision. Built by the daemon; policies never do I/O.

    ``concurrency`` is the live number of requests in flight where the request will run
    (the engine's batch for the embedded engine; the fleet's in-flight count for pools).
    Per-position acceptance ``accept_rates[i]`` is the estimated probability that drafted
    position i+1 is accepted given positions 1..i were (conditional, per task).
    """

    task: Task
    confidence: float
    concurrency: int
    min_spec_tokens: int
    max_spec_tokens: int
    block_size: int
    pools: tuple[PoolView, ...] = ()
    accept_rates: tuple[float, ...] = ()
    # This request's own history (embedded engine, per step): recent accept lengths.
    request_accept_lengths: tuple[int, ...] = ()
    previous_spec_tokens: int | None = None
    step_index: int = 0
    now_s: float = 0.0
    # A uniform random number in [0, 1) supplied by the caller (policies draw no randomness).
    rng_u: float = 0.5
    extra: dict[str, float] = field(default_factory=dict)
    # k used at each of ``request_accept_lengths``' steps (same order), so that a policy can
    # tell a rejection from a position that was never drafted (censoring).
    request_spec_tokens: tuple[int, ...] = ()
    # Effective number of observations behind each ``accept_rates`` entry (for probing).
    accept_trials: tuple[float, ...] = ()
    # Step cost model T(B, k) snapshot (None: the policy uses its built-in estimate).
    step_cost: StepCost | None = None


@dataclass(frozen=True)
class Decision:
    """The policy's answer: k, optionally a pool, and a reason a person can read."""

    spec_tokens: int
    reason: str
    pool: str | None = None


class Policy(Protocol):
    """A pure function from observation to decision."""

    name: str

    def decide(self, observation: Observation) -> Decision: ...


def clamp_spec_tokens(k: int, min_spec_tokens: int, max_spec_tokens: int) -> int:
    """Clamp a non-zero k into [min, max]; 0 (drafting off) stays 0. The one clamp of k.

    The ceiling wins when the bounds cross (a small block cannot honour min_spec_tokens).
    """
    if k <= 0 or max_spec_tokens <= 0:
        return 0
    return min(max_spec_tokens, max(min_spec_tokens, k))


def served_spec_tokens(pool: PoolView, wanted: int) -> int:
    """The k a request that wants ``wanted`` runs with on ``pool``."""
    if pool.is_adjustable:
        return clamp_spec_tokens(wanted, 1, pool.spec_tokens)
    return pool.spec_tokens
