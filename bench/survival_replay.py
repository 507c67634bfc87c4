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

    R=bench/results/draft_confidence_testbed_h200_2026-12-04_raw.jsonl.gz
    .venv/bin/python bench/survival_replay.py $R
    .venv/bin/python bench/survival_replay.py --synthetic realistic
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
from policies.types import StepRow  # noqa: E402

Scorer = Callable[[list[StepRow], Callable[[str], Sequence[float]]], np.ndarray]


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
        j = np.arange(self.k)
        hits = self.hits.setdefault(task, np.zeros(self.k))
        trials = self.trials.setdefault(task, np.zeros(self.k))
        trials += j <= run
        hits += j < run


class AllocatorScorer:
    """The allocator's survival per step, as an engine's prepare and score would give it;
    ``allocator`` keeps what it learnt."""

    def __init__(self, settings: AllocatorSettings):
        self.allocator = SlotAllocator(settings, LinearCost())

    def __call__(self, rows: list[StepRow], rates: Callable[[str], Sequence[float]]) -> np.ndarray:
        prepared = self.allocator.prepare_step(rows, len(rows), rates)
        return self.allocator.score_step(prepared, [r.draft_confidence for r in rows])


def allocator_scorer(settings: AllocatorSettings) -> AllocatorScorer:
    return AllocatorScorer(settings)


def vllm_scorer(k: int) -> Scorer:
    policy = VllmAdaptiveVerification(VllmAvSettings(max_spec_tokens=k), LinearCost())

    def score(rows: list[StepRow], rates: Callable[[str], Sequence[float]]) -> np.ndarray:
        policy._learn(rows)
        policy._scored = None
        capacities = np.full(len(rows), k, dtype=np.int64)
        return policy._score(rows, capacities)

    return score


def replay(steps: Steps, rows_per_batch: int, scorers: dict[str, Scorer]) -> dict[str, Any]:
    k = steps.conf.shape[1]
    by_request: dict[int, list[int]] = {}
    for i, p in enumerate(steps.prompt.tolist()):
        by_request.setdefault(p, []).append(i)
    requests = sorted(by_request)
    rates = TaskRates(k)
    history: dict[int, tuple[list[int], list[int]]] = {p: ([], []) for p in requests}
    hits = {name: dict.fromkeys(MULTIPLES, 0.0) for name in scorers}
    predicted = {name: dict.fromkeys(MULTIPLES, 0.0) for name in scorers}
    verified = dict.fromkeys(MULTIPLES, 0.0)
    pooled: dict[str, list[np.ndarray]] = {name: [] for name in scorers}
    labels: list[np.ndarray] = []
    for group in range(0, len(requests), rows_per_batch):
        members = requests[group : group + rows_per_batch]
        longest = max(len(by_request[p]) for p in members)
        for t in range(longest):
            live = [p for p in members if t < len(by_request[p])]
            at = [by_request[p][t] for p in live]
            rows = [
                StepRow(
                    p,
                    str(steps.task[i]),
                    history[p][0],
                    history[p][1],
                    k,
                    tuple(steps.conf[i].tolist()),
                )
                for p, i in zip(live, at, strict=True)
            ]
            survive = steps.run[at][:, None] > np.arange(k)[None, :]
            total = int(survive.sum())
            labels.append(survive.ravel())
            for name, scorer in scorers.items():
                score = scorer(rows, rates)
                pooled[name].append(score.ravel())
                order = np.argsort(-score.ravel(), kind="stable")
                kept = survive.ravel()[order]
                believed = score.ravel()[order]
                for m in MULTIPLES:
                    d = min(len(order), round(m * total))
                    hits[name][m] += float(kept[:d].sum())
                    predicted[name][m] += float(believed[:d].sum())
            for m in MULTIPLES:
                verified[m] += min(survive.size, round(m * total))
            for p, i in zip(live, at, strict=True):
                run = int(steps.run[i])
                history[p][0].append(run + 1)
                history[p][1].append(k)
                rates.observe(str(steps.task[i]), run)
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
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_source_arguments(parser, requests=128, steps=40)
    parser.add_argument("--rows", type=int, default=64, help="requests that run together")
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
    policies = replay(steps, args.rows, scorers)
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
        "policies": policies,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, figures in result["policies"].items():
        print(f"{name:>22}: " + " ".join(f"{key}={v}" for key, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
