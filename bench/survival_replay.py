"""How well each policy's own survival scores rank a batch's draft slots, replayed offline.

``bench/confidence_joint.py`` fits estimators with hindsight (cross-validated); this replays
the policies' actual online scorers step by step on recorded steps, as an engine would call
them: draftctl's allocator (``policies.slot_allocator.SlotAllocator``: task prior, the
request's own history, per-task calibration of the draft's confidence) and vLLM's adaptive
verification (``policies.baselines.vllm_av``: one logistic of the confidence, no task, no
history), both learning online from what they scored.

The steps come from ``bench/draft_confidence.py --raw`` (a real pair, every step at the
widest k, so every slot's survival is known) or ``--synthetic SET`` (the GPU harness's
synthetic acceptance and drawn confidence, ``bench/confidence_joint.py``'s generator). The
requests run ``--rows`` at a time, all advancing one step per round; per round each policy
scores every (row, position) slot, and the replay verifies its best D slots, D = m x the
round's surviving slots (m = 0.5, 1, 2: the oracle's budget at m = 1). Reported: surviving
slots per verified slot (the oracle: 1.0 up to m = 1), summed over rounds, the pooled AUC of
the scores against survival, and what the scores promised for the verified slots over what
survived (calibration in the large: above 1 a budget rule over the scores overbuys, below 1
it underbuys). The task priors the allocator starts from are the online per-task
per-position acceptance of the rounds before (what the goodput policy's models give it);
vLLM's estimator has none.

By default the replay is *open loop*: every row's history records the widest k and its whole
run, so the history feature, the task priors and the online learning all see uncensored
outcomes, and every scorer scores with the freshest history. Two flags make it behave as an
engine does:

- ``--closed-loop``: each row verifies only the slots its policy allocated, the policy's D
  best at m = 1 (a prefix of each row's block, as survival is a cumulative product; k_r =
  how many of the row's slots are among them). Each policy keeps its own per-request
  histories (``spec_tokens`` k_r, accept length ``min(run, k_r) + 1``) and its own task
  priors (``TaskRates.observe_censored``), so it learns only from the positions a verify of
  k_r labels (j <= min(run, k_r - 1)), as the engine labels them. The figures at every
  multiple are still scored against the true runs (the replay knows every slot's survival);
  only the histories and the learning are censored at the m = 1 allocation. Added per
  policy: ``accepted_per_round`` and ``verified_per_round`` at m = 1 (the mean over rounds of
  sum_r min(run_r, k_r) and of sum_r k_r; ``oracle``: verifying the survivors alone), and
  ``allocator-min4``: the allocator as the goodput policy bounds its rows by default (k in
  {0} U [4, K] within the D slots, ``slot_scoring.bounded_allocation``), which only the m = 1
  allocation and so the accepted drafts per round show (the other policies take any k).
- ``--pipelined`` (implies ``--closed-loop``): the device path. Round t is scored while
  round t - 1 runs: each policy's ``device_scoring`` sees the rows' histories and the task
  priors only up to round t - 2 (the newest entry missing) and the rows' confidence of round
  t - 1 (for its budget, unused here), and learns from round t - 1 (``observed``) only after
  it has scored round t; the device applies the scoring to round t's fresh confidence
  (``policies.slot_scoring.survival``).

    R=bench/results/draft_confidence_testbed_h200_2026-12-04_raw.jsonl.gz
    .venv/bin/python bench/survival_replay.py $R
    .venv/bin/python bench/survival_replay.py --synthetic realistic
    .venv/bin/python bench/survival_replay.py --synthetic realistic --closed-loop
    .venv/bin/python bench/survival_replay.py --synthetic realistic --pipelined
    .venv/bin/python bench/survival_replay.py --synthetic realistic --pipelined --interleave

Each run takes seconds (a 2-core CPU: under 20 s for either source in any mode).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.confidence_joint import (  # noqa: E402
    MULTIPLES,
    Steps,
    add_source_arguments,
    steps_of,
)
from bench.draft_confidence import auc  # noqa: E402
from policies.baselines.vllm_av import VllmAdaptiveVerification, VllmAvSettings  # noqa: E402
from policies.slot_allocator import AllocatorSettings, SlotAllocator  # noqa: E402
from policies.slot_scoring import SlotScoring, bounded_allocation, survival  # noqa: E402
from policies.types import PositionValues, StepRow, Task  # noqa: E402

Rates = Callable[[str], Sequence[float]]
Scorer = Callable[[list[StepRow], Rates], np.ndarray]
History = tuple[list[int], list[int]]  # a request's accept lengths and spec tokens


@runtime_checkable
class DeviceScorer(Protocol):
    """A scorer with the device path too (``--pipelined``): the scoring made ahead from
    the rows (stale histories) and their earlier confidence, and the learning from a round
    that ran with it."""

    def __call__(self, rows: list[StepRow], rates: Rates) -> np.ndarray: ...

    def scoring(
        self, rows: list[StepRow], rates: Rates, previous: Sequence[PositionValues | None]
    ) -> SlotScoring: ...

    def observed(
        self,
        scoring: SlotScoring,
        confidence: Sequence[PositionValues],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
    ) -> None: ...


class LinearCost:
    """A step's seconds (unused by the scores; the policies' constructors need one)."""

    def step_time_s(self, batch_size: int, spec_tokens: int) -> float:
        return 0.01 + 2e-5 * (batch_size + spec_tokens)


class TaskRates:
    """Per task and position, conditional acceptance counted over the rounds so far."""

    def __init__(self, k: int):
        self.k = k
        self.hits: dict[str, np.ndarray] = {}
        self.trials: dict[str, np.ndarray] = {}

    def __call__(self, task: str) -> list[float]:
        hits = self.hits.get(task, np.zeros(self.k))
        trials = self.trials.get(task, np.zeros(self.k))
        return list((hits + 1.0) / (trials + 2.0))

    def observe(self, task: str, run: int) -> None:
        """A step verified at the widest k whose first ``run`` drafts were accepted."""
        self.observe_censored(task, run, self.k)

    def observe_censored(self, task: str, run: int, k: int) -> None:
        """A step that verified ``k`` drafts of a block whose first ``run`` survive: as the
        engine labels it, positions j <= min(run, k - 1) are trials (j < k), those below
        min(run, k) hits; the rest are censored (k = 0: nothing)."""
        j = np.arange(self.k)
        hits = self.hits.setdefault(task, np.zeros(self.k))
        trials = self.trials.setdefault(task, np.zeros(self.k))
        trials += (j <= min(run, k - 1)) & (j < k)
        hits += j < min(run, k)


def record(history: History, run: int, k: int) -> None:
    """What the engine's history gets from a step that verified ``k`` drafts of a block
    whose first ``run`` survive: accept length ``min(run, k) + 1`` (bonus included) and k."""
    history[0].append(min(run, k) + 1)
    history[1].append(k)


def allocated(order: np.ndarray, slots: int, rows: int, k: int) -> np.ndarray:
    """k per row when the ``slots`` best of the flat (row-major) slot ``order`` are verified.
    Survival is a cumulative product along a row (ties keep row order in the stable sort),
    so each row's verified slots are a prefix of its block: their count is its k."""
    return np.bincount(order[:slots] // k, minlength=rows).astype(np.int64)


class _Learns:
    """A scorer's device-path learning: its policy's own ``observed``."""

    def _learner(self) -> Any:
        raise NotImplementedError

    def observed(
        self,
        scoring: SlotScoring,
        confidence: Sequence[PositionValues],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
    ) -> None:
        self._learner().observed(scoring, confidence, spec_tokens, accept_lengths)


class AllocatorScorer(_Learns):
    """The allocator's survival per step, as an engine's prepare and score would give it
    (``__call__``), or as its device path would (``scoring``, ``observed``); ``allocator``
    keeps what it learnt."""

    def __init__(self, settings: AllocatorSettings, bounded: bool = False):
        self.allocator = SlotAllocator(settings, LinearCost())
        # closed loop: the bound its rows' k keep (``settings.min_spec_tokens`` when
        # ``bounded``; else 1: any k, as every other policy here)
        self.min_spec_tokens = settings.min_spec_tokens if bounded else 1

    def __call__(self, rows: list[StepRow], rates: Rates) -> np.ndarray:
        prepared = self.allocator.prepare_step(rows, len(rows), rates)
        return self.allocator.score_step(prepared, [r.draft_confidence for r in rows])

    def scoring(
        self, rows: list[StepRow], rates: Rates, previous: Sequence[PositionValues | None]
    ) -> SlotScoring:
        return self.allocator.device_scoring(rows, len(rows), rates, previous)[1]

    def _learner(self) -> Any:
        return self.allocator


def allocator_scorer(settings: AllocatorSettings) -> AllocatorScorer:
    return AllocatorScorer(settings)


class VllmScorer(_Learns):
    """vLLM's estimator per step, on the host path (``__call__``: learn, then score every
    slot) or its device path (``scoring``, ``observed``); ``policy`` keeps what it learnt."""

    def __init__(self, k: int):
        self.k = k
        self.policy = VllmAdaptiveVerification(VllmAvSettings(max_spec_tokens=k), LinearCost())

    def __call__(self, rows: list[StepRow], rates: Rates) -> np.ndarray:
        self.policy._learn(rows)
        self.policy._scored = None
        capacities = np.full(len(rows), self.k, dtype=np.int64)
        return self.policy._score(rows, capacities)

    def scoring(
        self, rows: list[StepRow], rates: Rates, previous: Sequence[PositionValues | None]
    ) -> SlotScoring:
        # vLLM's budget reads the confidence the rows carry: each row's of an earlier round
        earlier = [r._replace(draft_confidence=c) for r, c in zip(rows, previous, strict=True)]
        return self.policy.device_scoring(earlier, len(rows))[1]

    def _learner(self) -> Any:
        return self.policy


def vllm_scorer(k: int) -> VllmScorer:
    return VllmScorer(k)


def interleaved(requests: Sequence[int], tasks: Sequence[str]) -> list[int]:
    """``requests`` round-robin across their ``tasks`` (tasks in first-seen order, each
    task's requests in the given order)."""
    queues: dict[str, list[int]] = {}
    for request, task in zip(requests, tasks, strict=True):
        queues.setdefault(task, []).append(request)
    out: list[int] = []
    for i in range(max((len(q) for q in queues.values()), default=0)):
        out.extend(q[i] for q in queues.values() if i < len(q))
    return out


def replay(
    steps: Steps,
    rows_per_batch: int,
    scorers: dict[str, Scorer],
    *,
    closed_loop: bool = False,
    pipelined: bool = False,
    interleave: bool = False,
) -> dict[str, Any]:
    """Each policy's figures (the module docstring); ``pipelined`` implies ``closed_loop``
    and needs ``DeviceScorer`` scorers. ``interleave``: requests taken round-robin across
    tasks, so each batch mixes them (by default in the source's order: a synthetic source
    lists each task's requests together, so its batches hold one task each)."""
    closed_loop = closed_loop or pipelined
    if pipelined:
        lacking = [name for name, s in scorers.items() if not isinstance(s, DeviceScorer)]
        if lacking:
            raise TypeError(f"--pipelined needs device scorers; not: {', '.join(lacking)}")
    k = steps.conf.shape[1]
    by_request: dict[int, list[int]] = {}
    for i, p in enumerate(steps.prompt.tolist()):
        by_request.setdefault(p, []).append(i)
    requests = sorted(by_request)
    if interleave:
        requests = interleaved(requests, [str(steps.task[by_request[p][0]]) for p in requests])
    # per policy: its own task priors and its requests' histories (open loop: all alike)
    rates = {name: TaskRates(k) for name in scorers}
    history: dict[str, dict[int, History]] = {
        name: {p: ([], []) for p in requests} for name in scorers
    }
    # pipelined: what reaches a policy's host only once it has scored the next round
    late: dict[str, tuple[SlotScoring, list[np.ndarray], list[int], list[int]] | None]
    late = dict.fromkeys(scorers)
    late_rates: dict[str, list[tuple[str, int, int]]] = {name: [] for name in scorers}
    hits = {name: dict.fromkeys(MULTIPLES, 0.0) for name in scorers}
    predicted = {name: dict.fromkeys(MULTIPLES, 0.0) for name in scorers}
    verified = dict.fromkeys(MULTIPLES, 0.0)
    accepted_1x = dict.fromkeys(scorers, 0)
    verified_1x = dict.fromkeys(scorers, 0)
    rounds = survivors = 0
    pooled: dict[str, list[np.ndarray]] = {name: [] for name in scorers}
    labels: list[np.ndarray] = []
    for group in range(0, len(requests), rows_per_batch):
        members = requests[group : group + rows_per_batch]
        longest = max(len(by_request[p]) for p in members)
        for t in range(longest):
            live = [p for p in members if t < len(by_request[p])]
            at = [by_request[p][t] for p in live]
            tasks = [str(steps.task[i]) for i in at]
            runs = steps.run[at]
            confidence = steps.conf[at]
            # each row's confidence of the round before (None at its first round)
            previous: list[PositionValues | None] = [
                steps.conf[by_request[p][t - 1]] if t > 0 and pipelined else None for p in live
            ]
            survive = runs[:, None] > np.arange(k)[None, :]
            total = int(survive.sum())
            rounds += 1
            survivors += total
            labels.append(survive.ravel())
            for name, scorer in scorers.items():
                own = history[name]
                if pipelined:
                    assert isinstance(scorer, DeviceScorer)
                    # scored while round t - 1 runs: the histories up to round t - 2
                    stale = [
                        StepRow(p, Task(task), own[p][0][:-1], own[p][1][:-1], k, c)
                        for p, task, c in zip(live, tasks, previous, strict=True)
                    ]
                    scoring = scorer.scoring(stale, rates[name], previous)
                    # round t - 1 has run meanwhile: its outcome reaches the host now
                    pending = late[name]
                    if pending is not None:
                        scorer.observed(*pending)
                    for outcome in late_rates[name]:
                        rates[name].observe_censored(*outcome)
                    late_rates[name].clear()
                    score = survival(scoring, confidence)
                else:
                    rows = [
                        StepRow(p, Task(task), own[p][0], own[p][1], k, tuple(c.tolist()))
                        for p, task, c in zip(live, tasks, confidence, strict=True)
                    ]
                    score = scorer(rows, rates[name])
                pooled[name].append(score.ravel())
                order = np.argsort(-score.ravel(), kind="stable")
                kept = survive.ravel()[order]
                believed = score.ravel()[order]
                for m in MULTIPLES:
                    d = min(len(order), round(m * total))
                    hits[name][m] += float(kept[:d].sum())
                    predicted[name][m] += float(believed[:d].sum())
                if closed_loop:  # each row verifies its slots among the policy's D best at 1x
                    slots = min(len(order), total)
                    ks = allocated(order, slots, len(live), k)
                    low = getattr(scorer, "min_spec_tokens", 1)
                    if low > 1:  # k in {0} U [low, K] within the D slots, as the engine bounds
                        caps = np.full(len(live), k, dtype=np.int64)
                        ks = bounded_allocation(score, caps, slots, low)
                else:
                    ks = np.full(len(live), k, dtype=np.int64)
                accepted_1x[name] += int(np.minimum(runs, ks).sum())
                verified_1x[name] += int(ks.sum())
                for p, task, run, k_r in zip(live, tasks, runs.tolist(), ks.tolist(), strict=True):
                    record(own[p], run, k_r)
                    if pipelined:
                        late_rates[name].append((task, run, k_r))
                    else:
                        rates[name].observe_censored(task, run, k_r)
                if pipelined:
                    lengths = (np.minimum(runs, ks) + 1).tolist()
                    late[name] = (scoring, list(confidence), ks.tolist(), lengths)
            for m in MULTIPLES:
                verified[m] += min(survive.size, round(m * total))
    for name, scorer in scorers.items():  # the last round's outcome reaches the host too
        pending = late[name]
        if pending is not None and isinstance(scorer, DeviceScorer):
            scorer.observed(*pending)
        for outcome in late_rates[name]:
            rates[name].observe_censored(*outcome)
    truth = np.concatenate(labels).astype(int)
    out: dict[str, Any] = {}
    for name in scorers:
        out[name] = {
            "auc_survival": round(float(auc(np.concatenate(pooled[name]), truth) or 0), 4),
            **{
                f"survivors_per_slot_at_{m:g}x": round(hits[name][m] / max(verified[m], 1), 4)
                for m in MULTIPLES
            },
            # what the scores promised for those slots, over what survived (1: calibrated;
            # above 1 a budget rule over these scores buys more slots than pay)
            **{
                f"promised_over_survived_at_{m:g}x": round(
                    predicted[name][m] / max(hits[name][m], 1e-9), 4
                )
                for m in MULTIPLES
            },
        }
        if closed_loop:  # at m = 1: drafts accepted and verified per round, summed over rows
            out[name]["accepted_per_round"] = round(accepted_1x[name] / max(rounds, 1), 3)
            out[name]["verified_per_round"] = round(verified_1x[name] / max(rounds, 1), 3)
    if closed_loop:  # verifying the survivors alone
        out["oracle"] = {
            **{f"survivors_per_slot_at_{m:g}x": round(min(1.0, 1 / m), 4) for m in MULTIPLES},
            "accepted_per_round": round(survivors / max(rounds, 1), 3),
            "verified_per_round": round(survivors / max(rounds, 1), 3),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_source_arguments(parser, requests=128, steps=40)
    parser.add_argument("--rows", type=int, default=64, help="requests that run together")
    parser.add_argument(
        "--closed-loop",
        action="store_true",
        help="each row verifies only its policy's slots at 1x: censored histories and learning",
    )
    parser.add_argument(
        "--pipelined",
        action="store_true",
        help="closed loop on the device path: each round scored from the histories a round late",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="batches mix the tasks (requests round-robin across tasks), as a mixed trace's do",
    )
    args = parser.parse_args(argv)
    steps = steps_of(args, parser)
    k = steps.conf.shape[1]
    scorers: dict[str, Scorer] = {
        "allocator": allocator_scorer(AllocatorSettings(max_spec_tokens=k)),
        "allocator-no-history": allocator_scorer(
            AllocatorSettings(
                max_spec_tokens=k, request_window=1, request_strength=1e9, recency_decay=0.0
            )
        ),
        "allocator-no-recency": allocator_scorer(
            AllocatorSettings(max_spec_tokens=k, recency_decay=0.0)
        ),
        "vllm-av": vllm_scorer(k),
    }
    if args.closed_loop or args.pipelined:
        # the allocator as the goodput policy bounds it by default: k in {0} U [4, K]
        scorers["allocator-min4"] = AllocatorScorer(
            AllocatorSettings(max_spec_tokens=k, min_spec_tokens=min(4, k)), bounded=True
        )
    policies = replay(
        steps,
        args.rows,
        scorers,
        closed_loop=args.closed_loop,
        pipelined=args.pipelined,
        interleave=args.interleave,
    )
    for name, scorer in scorers.items():
        if isinstance(scorer, AllocatorScorer) and scorer.allocator.settings.recency_decay > 0:
            weights = scorer.allocator.recency_weights()
            policies[name]["recency_weight_end"] = {t: round(w, 3) for t, w in weights.items()}
    result = {
        "command": " ".join(["python", *sys.argv]),
        "source": (args.synthetic and f"synthetic:{args.synthetic}") or str(args.raw),
        "positions": k,
        "steps": len(steps.run),
        "rows": args.rows,
        "interleaved": args.interleave,
    }
    if args.closed_loop or args.pipelined:
        result["mode"] = "pipelined" if args.pipelined else "closed-loop"
    result["policies"] = policies
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, figures in result["policies"].items():
        print(f"{name:>22}: " + " ".join(f"{key}={v}" for key, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
