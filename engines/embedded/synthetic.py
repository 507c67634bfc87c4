"""Synthetic acceptance (benchmark only): the accept decision is drawn, not verified.

Semantics follow vLLM's ``rejection_sample_method="synthetic"`` (vllm/config/speculative.py,
vllm/v1/spec_decode/utils.py; PRs vllm-project/vllm#40662 and #41035): drafted position i is
accepted with a *conditional* rate c_i (given positions 1..i-1 were accepted), stopping at the
first rejection. Extended (docs/synthetic.md) with per-task profiles and two logit-space
offsets added to every position's base logit: a per-request offset ~ N(0, request_spread) and
a drift across steps, AR(1) with lag-1 correlation ``drift_corr`` and stationary std
``drift_spread``. A row drafting k accepts ``min(k, run)`` where ``run`` is the drawn run over
all of the profile's positions, so one draw answers every k.

Every draw is a pure function of (seed, request key, step): a counter-based hash, no
generator state, so batch composition, timing and the policy's choice of k change nothing,
and an oracle reads a step ahead with ``accept_run``. No torch here (numpy, host only).

With random weights the draft's own confidence means nothing, so a step that reads confidence
gets a synthetic one (``draft_confidence``) derived from the same step's drawn run, with the
predictive power (AUC) a trained pair measured: policies/confidence_model.py.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, ClassVar

import numpy as np

from engines.embedded.synthetic_rates import TaskProfile, sigmoid
from policies.confidence_model import confidence_logit, separation

SYNTHETIC_WARNING = (
    "SYNTHETIC ACCEPTANCE (benchmark only): draft tokens are accepted by seeded draws from an "
    "acceptance profile, not by verification against the target, so the output is NOT the "
    "target model's output"
)
CONTEXT_TASK, CONTEXT_KEY = "task", "synthetic_key"  # request context keys read here

# -- counter-based draws (splitmix64 finaliser over (seed, key, stream, step, position)) -------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_STREAM_ACCEPT, _STREAM_REQUEST, _STREAM_DRIFT, _STREAM_CONFIDENCE = 1, 2, 3, 4


def _hash(h: np.ndarray, word: np.ndarray | int) -> np.ndarray:
    """Fold one word (int64 values, negatives included) into the uint64 hashes ``h``: the
    splitmix64 finaliser of h + (word + 1) * golden ratio; uint64 arithmetic wraps."""
    w = np.asarray(word, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        x = h + (w + np.uint64(1)) * _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _uniform(h: np.ndarray) -> np.ndarray:
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53  # [0, 1)


def _normal(h: np.ndarray) -> np.ndarray:
    """Box-Muller from the two 32-bit halves of each hash."""
    u1 = ((h >> np.uint64(32)).astype(np.float64) + 1.0) * 2.0**-32  # (0, 1]
    u2 = (h & np.uint64(0xFFFFFFFF)).astype(np.float64) * 2.0**-32
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


@lru_cache(maxsize=65536)
def _key_word(key: str) -> int:
    """A stable 64-bit word for a request key (Python's ``hash`` is salted per process)."""
    return int.from_bytes(
        hashlib.blake2b(key.encode(), digest_size=8).digest(), "little", signed=True
    )


# -- the mode ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticAcceptance:
    """Per-task profiles plus a seed: what ``ModelRunner(synthetic=...)`` draws from.

    A request is identified by ``identity(request_id, context)``: its task is
    ``context["task"]`` and its key ``context.get("synthetic_key", request_id)``; its step is
    the number of decode steps it has run (``RequestView.step_index``).

    ``confidence_auc``: the AUC of the synthetic draft confidence against survival
    (``draft_confidence``); None leaves the draft's own confidence in place (the profile file
    always sets it)."""

    profiles: Mapping[str, TaskProfile]
    seed: int = 0
    name: str = "custom"
    confidence_auc: float | None = None
    SYNTHETIC_WARNING: ClassVar[str] = SYNTHETIC_WARNING

    def __post_init__(self) -> None:
        if not self.profiles:
            raise ValueError("synthetic acceptance needs at least one task profile")
        if type(self.seed) is not int or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed={self.seed!r}: must be an integer in [0, 2**63)")
        if self.confidence_auc is not None:
            separation(self.confidence_auc)  # raises for an AUC outside [0.5, 1)

    @property
    def num_positions(self) -> int:
        """The largest k every profile covers."""
        return min(p.num_positions for p in self.profiles.values())

    @property
    def warning(self) -> str:
        return f"{SYNTHETIC_WARNING} [profile set {self.name!r}, seed {self.seed}]"

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary for logs and responses."""
        k = self.num_positions
        return {
            "mode": "synthetic_acceptance",
            "warning": self.warning,
            "profile_set": self.name,
            "seed": self.seed,
            "confidence_auc": self.confidence_auc,
            "expected_accept_length": {
                task: {"k": k, "mean": round(p.expected_accept_length(k), 3)}
                for task, p in self.profiles.items()
            },
        }

    @staticmethod
    def identity(request_id: str, context: Mapping[str, Any]) -> tuple[str, str]:
        """(task, key) of a request, the same for the runner and for an oracle."""
        return str(context.get(CONTEXT_TASK, "")), str(context.get(CONTEXT_KEY, request_id))

    def profile(self, task: str) -> TaskProfile:
        found = self.profiles.get(task)
        if found is None:
            raise ValueError(
                f"task {task!r}: synthetic profile set {self.name!r} has {sorted(self.profiles)}; "
                f"put one of them in the request context as {CONTEXT_TASK!r}"
            )
        return found

    def accept_runs(
        self, tasks: Sequence[str], keys: Sequence[str], steps: Sequence[int], k_max: int
    ) -> np.ndarray:
        """Accepted drafts per row if k_max were drafted: int64 [B]. Drafting k <= k_max the row
        accepts min(k, run). One vectorised host computation for the whole batch."""
        if not 0 <= k_max <= self.num_positions:
            raise ValueError(f"k_max={k_max}: must be in [0, {self.num_positions}]")
        table, index = self._table, self._task_index(tasks)
        rows, step = self._rows(keys), np.asarray(steps, dtype=np.int64)
        offsets = self._offsets(index, rows, step)
        logits = table.logits[index, :k_max] + offsets[:, None]
        u = _uniform(
            _hash(_hash(_hash(rows, _STREAM_ACCEPT), step)[:, None], table.positions[:, :k_max])
        )
        accepted = u < sigmoid(logits)  # u < c_i; rates 0 and 1 stay exact
        return np.cumprod(accepted, axis=1).sum(axis=1)

    def draft_confidence(
        self, keys: Sequence[str], steps: Sequence[int], runs: np.ndarray, k: int
    ) -> np.ndarray:
        """Synthetic draft confidence at positions 1..k of each row's step: float64 [B, k].

        ``runs``: the rows' drawn runs at these steps (``accept_runs``; position j survives iff
        j < run). ``c = sigmoid(bias + separation * (y - 1/2) + e)`` with ``e`` a normal of
        (seed, key, step, position): the same values whatever k, batch or timing, so its AUC
        against survival is ``confidence_auc`` (policies/confidence_model.py)."""
        if self.confidence_auc is None:
            raise ValueError("this synthetic acceptance has no confidence_auc")
        rows, step = self._rows(keys), np.asarray(steps, dtype=np.int64)
        positions = np.arange(k, dtype=np.int64)[None, :]
        noise = _normal(_hash(_hash(_hash(rows, _STREAM_CONFIDENCE), step)[:, None], positions))
        survives = positions < np.asarray(runs, dtype=np.int64)[:, None]
        return sigmoid(confidence_logit(survives, noise, separation(self.confidence_auc)))

    def accept_run(self, task: str, key: str, step: int, k_max: int) -> int:
        """One request's accepted drafts at ``step`` if k_max were drafted (oracle read-ahead)."""
        return int(self.accept_runs([task], [key], [step], k_max)[0])

    def step_offset(self, task: str, key: str, step: int) -> float:
        """The logit offset (request + drift) of one request at one step (tests, analysis)."""
        index = self._task_index([task])
        return float(self._offsets(index, self._rows([key]), np.array([step]))[0])

    @cached_property
    def _table(self) -> _Table:
        tasks = tuple(self.profiles)
        profiles = [self.profiles[t] for t in tasks]
        lags = max(len(p.drift_weights) for p in profiles)
        weights = np.zeros((len(profiles), lags))
        for i, p in enumerate(profiles):
            weights[i, : len(p.drift_weights)] = p.drift_weights
        n = self.num_positions
        return _Table(
            index={t: i for i, t in enumerate(tasks)},
            logits=np.stack([p.base_logits[:n] for p in profiles]),
            request_spread=np.array([p.request_spread for p in profiles]),
            drift_weights=weights,
            lags=np.arange(lags, dtype=np.int64)[None, :],
            positions=np.arange(n, dtype=np.int64)[None, :],
            root=_hash(np.array([self.seed], dtype=np.int64).view(np.uint64), 0),
        )

    def _task_index(self, tasks: Sequence[str]) -> np.ndarray:
        index = self._table.index
        try:
            return np.array([index[t] for t in tasks], dtype=np.int64)
        except KeyError as exc:
            self.profile(str(exc.args[0]))  # raises the ValueError naming the task
            raise

    def _rows(self, keys: Sequence[str]) -> np.ndarray:
        words = np.array([_key_word(str(k)) for k in keys], dtype=np.int64)
        return _hash(self._table.root, words)

    def _offsets(self, index: np.ndarray, rows: np.ndarray, step: np.ndarray) -> np.ndarray:
        """Per row: request_spread * z_request + sum_m w_m z_drift(step - m)."""
        table = self._table
        offset = table.request_spread[index] * _normal(_hash(rows, _STREAM_REQUEST))
        weights = table.drift_weights[index]
        if weights.any():
            past = step[:, None] - table.lags
            z = _normal(_hash(_hash(rows, _STREAM_DRIFT)[:, None], past))
            offset = offset + (weights * z).sum(axis=1)
        return offset


@dataclass(frozen=True)
class _Table:
    """A profile set as arrays (row lookups by task index)."""

    index: dict[str, int]
    logits: np.ndarray  # [tasks, positions]
    request_spread: np.ndarray  # [tasks]
    drift_weights: np.ndarray  # [tasks, lags]
    lags: np.ndarray  # [1, lags]
    positions: np.ndarray  # [1, positions]
    root: np.ndarray  # [1] hash of the seed


def assemble_rows(
    packed: list[list[int]], spec_tokens: Sequence[int], runs: Sequence[int], widest: int
) -> tuple[list[list[bool]], list[list[int]]]:
    """Per row of ``packed`` = [drafts (widest), target token at each position (widest + 1)]:
    accept a = min(k, run) drafts, emit them and then the target's token at position a."""
    accepted_rows, token_rows = [], []
    for row, k, run in zip(packed, spec_tokens, runs, strict=True):
        a = min(k, run)
        accepted_rows.append([True] * a + [False] * (k - a))
        token_rows.append([*row[:a], row[widest + a]])
    return accepted_rows, token_rows
