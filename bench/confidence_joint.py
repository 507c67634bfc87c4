"""What a block's confidences say together: survival estimators and the synthetic model's fit.

Reads the steps ``bench/draft_confidence.py --raw`` keeps (every drafted position's top-1
draft probability and the step's accept length) and asks two questions of issue 16:

1. **Does the whole block predict survival better than the positions before it?** vLLM's
   estimator (and draftctl's allocator) scores slot (r, j) by the product of per-position
   acceptance estimates for positions 1..j, each from that position's own confidence. A
   block's later confidences also carry information (an easy stretch of text is confident
   throughout). Compared, with 2-fold cross-validation by prompt:

   - ``prefix``: per-position logistic of conditional acceptance on logit(c_i) (fit on the
     uncensored positions, as vLLM does), survival = cumulative product;
   - ``block``: per position j, a logistic of survival S_j = [run > j] on the prefix score's
     log plus the mean logit confidence of the block and of the positions after j
     (monotone: a cumulative minimum along the row).

   - ``prefix+task+history``: ``prefix`` with the task and the request's own recent runs
     (an average of its previous steps' run / k, halving each step) as extra features of
     every position's logistic: what draftctl's allocator knows and vLLM's does not.

   Each is scored by the pooled AUC of survival over every (step, position) slot and by the
   allocation it makes: verifying the best D slots of a pool of steps, how many survive
   (per verified slot, at D = 0.5 / 1 / 2 x the pool's surviving slots; the oracle verifies
   survivors only, 1.0 at D <= 1x).

2. **Does the synthetic confidence model (docs/synthetic.md) have the real joint structure?**
   It draws position j's confidence from survival S_j, so after the first rejection every
   position looks like a rejection. The real draft's positions after the first rejection are
   compared with its accepted positions and its first rejections (mean and sd of logit c),
   and the same estimators are run on synthetic steps drawn with the real steps' runs.

    R=bench/results
    .venv/bin/python bench/confidence_joint.py $R/draft_confidence_demo_cpu_raw.jsonl.gz \\
        --out $R/confidence_joint_demo_cpu.json

``--synthetic SET`` reads no file: it draws the steps of ``--requests`` requests per task of
``--steps`` steps each from the synthetic profile set (runs and drawn confidence as the GPU
harness's synthetic arms get them; every request drafts the widest k), so the same questions
can be asked of the model the harness measures policies on.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.draft_confidence import auc  # noqa: E402
from engines.embedded.synthetic_profiles import load_profile_set  # noqa: E402
from policies.confidence_model import confidence_logit, separation  # noqa: E402
from sim.ragged_choosers import run_posterior  # noqa: E402

EPS = 1e-6
HISTORY_DECAY = 0.5
MULTIPLES = (0.5, 1.0, 2.0)  # budgets: verified slots per surviving slot of the pool


@dataclass(frozen=True)
class Steps:
    """Steps in request order: confidence [N, k], run [N] (accepted drafts), prompt [N] (the
    request), task [N], history [N] (the request's earlier runs / k, halving weights; 0 at
    its first step) and has_history [N]."""

    conf: np.ndarray
    run: np.ndarray
    prompt: np.ndarray
    task: np.ndarray

    @property
    def history(self) -> tuple[np.ndarray, np.ndarray]:
        k = self.conf.shape[1]
        value, seen = np.zeros(len(self.run)), np.zeros(len(self.run))
        state: dict[int, tuple[float, int]] = {}
        for i, (p, r) in enumerate(zip(self.prompt.tolist(), self.run.tolist(), strict=True)):
            h, n = state.get(p, (0.0, 0))
            value[i], seen[i] = h, n > 0
            state[p] = (r / k if n == 0 else HISTORY_DECAY * h + (1 - HISTORY_DECAY) * r / k, n + 1)
        return value, seen

    def subset(self, mask: np.ndarray) -> Steps:
        return Steps(self.conf[mask], self.run[mask], self.prompt[mask], self.task[mask])


def load(path: Path) -> Steps:
    """The steps of a ``draft_confidence.py --raw`` file (steps of the widest k only)."""
    conf, run, prompt, task = [], [], [], []
    with gzip.open(path, "rt") as f:
        for line in f:
            row = json.loads(line)
            conf.append(row["confidence"])
            run.append(row["accept_length"] - 1)
            prompt.append(row["prompt"])
            task.append(row["task"])
    width = max(len(c) for c in conf)
    kept = [i for i, c in enumerate(conf) if len(c) == width]
    return Steps(
        np.array([conf[i] for i in kept], dtype=np.float64),
        np.array([run[i] for i in kept], dtype=np.int64),
        np.array([prompt[i] for i in kept], dtype=np.int64),
        np.array([task[i] for i in kept]),
    )


def synthetic_steps(profile_set: str, requests: int, steps: int, seed: int) -> Steps:
    """Every request of every task of the set at the widest k for ``steps`` steps."""
    synthetic = load_profile_set(profile_set, seed=seed)
    k = synthetic.num_positions
    tasks, keys, index = [], [], []
    for t in sorted(synthetic.profiles):
        for r in range(requests):
            tasks.append(t)
            keys.append(f"{t}-{r}")
            index.append(len(index))
    conf, run, prompt, task = [], [], [], []
    for step in range(steps):
        at = [step] * len(keys)
        runs = synthetic.accept_runs(tasks, keys, at, k)
        conf.append(synthetic.draft_confidence(keys, at, runs, k))
        run.append(runs)
        prompt.append(index)
        task.append(tasks)
    request = np.concatenate([np.array(p) for p in prompt])
    order = np.lexsort((np.repeat(np.arange(steps), len(keys)), request))
    return Steps(
        np.concatenate(conf)[order],
        np.concatenate(run)[order],
        request[order],
        np.concatenate([np.array(t) for t in task])[order],
    )


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, iters: int = 30) -> np.ndarray:
    """Weights (last = intercept) of a ridge-regularised logistic regression (Newton)."""
    design = np.column_stack([x, np.ones(len(x))])
    w = np.zeros(design.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-design @ w))
        grad = design.T @ (p - y) + l2 * w
        hess = (design * (p * (1 - p))[:, None]).T @ design + l2 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def predict(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-(np.column_stack([x, np.ones(len(x))]) @ w)))


def prefix_model(
    conf: np.ndarray,
    run: np.ndarray,
    train: np.ndarray,
    test: np.ndarray,
    extra: np.ndarray | None = None,
) -> np.ndarray:
    """Survival [test, k]: per-position logistic of conditional acceptance on logit c (and
    the columns of ``extra`` [N, f], per step), fit on the training steps' uncensored
    positions, multiplied along the row."""
    k = conf.shape[1]
    lc = logit(conf)
    p = np.empty((int(test.sum()), k))
    for j in range(k):
        x = lc[:, j : j + 1] if extra is None else np.column_stack([lc[:, j], extra])
        reached = train & (run >= j)
        w = fit_logistic(x[reached], (run[reached] > j).astype(np.float64))
        p[:, j] = predict(w, x[test])
    survival: np.ndarray = np.cumprod(p, axis=1)
    return survival


def block_features(conf: np.ndarray, prefix: np.ndarray, j: int) -> np.ndarray:
    lc = logit(conf)
    after = lc[:, j + 1 :].mean(axis=1) if j + 1 < conf.shape[1] else np.zeros(len(conf))
    return np.column_stack([np.log(np.clip(prefix[:, j], EPS, 1)), lc.mean(axis=1), after])


def block_model(
    conf: np.ndarray, run: np.ndarray, train: np.ndarray, test: np.ndarray
) -> np.ndarray:
    """Survival [test, k]: per position, a logistic of S_j on the prefix score's log and the
    block's mean confidences (whole block, after j); monotone along the row."""
    k = conf.shape[1]
    # the prefix score for the training steps comes from an inner fit on the training steps
    prefix_train = prefix_model(conf, run, train, train)
    prefix_test = prefix_model(conf, run, train, test)
    out = np.empty((int(test.sum()), k))
    for j in range(k):
        y = (run[train] > j).astype(np.float64)
        w = fit_logistic(block_features(conf[train], prefix_train, j), y)
        out[:, j] = predict(w, block_features(conf[test], prefix_test, j))
    survival: np.ndarray = np.minimum.accumulate(out, axis=1)
    return survival


def run_model(
    conf: np.ndarray, run: np.ndarray, task: np.ndarray, train: np.ndarray, test: np.ndarray
) -> np.ndarray:
    """Survival [test, k]: the exact posterior of the run's length from positions 1..j
    (``sim.ragged_choosers.run_posterior``, prefix read), on the task's survival curve and a
    per-position normal likelihood of logit c given whether the position survives (fit on the
    training steps): the form the simulator's exact-posterior references take, fitted."""
    k = conf.shape[1]
    lc = logit(conf)
    survive = run[:, None] > np.arange(k)[None, :]
    llr = np.zeros((len(conf), k))
    for j in range(k):
        x, y = lc[train, j], survive[train, j]
        if y.all() or not y.any():
            continue
        (m1, s1), (m0, s0) = ((x[c].mean(), x[c].std() + 1e-3) for c in (y, ~y))
        z = lc[:, j]
        llr[:, j] = np.log(s0 / s1) - 0.5 * ((z - m1) / s1) ** 2 + 0.5 * ((z - m0) / s0) ** 2
    prior = np.ones((len(conf), k + 1))
    for t in set(task.tolist()):
        mine = task == t
        curve = (run[train & mine][:, None] > np.arange(k)[None, :]).mean(axis=0)
        prior[mine, 1:] = np.clip(np.minimum.accumulate(curve), EPS, 1 - EPS)
    survival: np.ndarray = run_posterior(prior[test], llr[test], joint=False)
    return survival


def extra_features(steps: Steps) -> np.ndarray:
    """Task indicators (all but the last task) and the request's own history."""
    names = sorted(set(steps.task.tolist()))
    history, seen = steps.history
    columns = [(steps.task == t).astype(np.float64) for t in names[:-1]]
    return (
        np.column_stack([*columns, history, seen]) if columns else np.column_stack([history, seen])
    )


def allocation(score: np.ndarray, survive: np.ndarray) -> dict[str, float]:
    """Survivors per verified slot when the best D slots by score are verified, D = m x the
    pool's surviving slots (the oracle's budget at m = 1)."""
    order = np.argsort(-score.ravel(), kind="stable")
    hits = survive.ravel()[order]
    total = survive.sum()
    out = {}
    for m in MULTIPLES:
        d = min(len(order), max(1, int(m * total)))
        out[f"survivors_per_slot_at_{m:g}x"] = round(float(hits[:d].mean()), 4)
    return out


def evaluate(steps: Steps) -> dict[str, Any]:
    """The estimators, 2-fold by request, pooled over the folds."""
    conf, run = steps.conf, steps.run
    k = conf.shape[1]
    survive = (run[:, None] > np.arange(k)[None, :]).astype(np.float64)
    fold = (steps.prompt % 2).astype(bool)
    extra = extra_features(steps)
    names = ("prefix", "prefix+task+history", "block", "prefix-run")
    scores = {name: np.empty_like(conf) for name in names}
    for held in (False, True):
        test = fold == held
        train = ~test
        scores["prefix"][test] = prefix_model(conf, run, train, test)
        scores["prefix+task+history"][test] = prefix_model(conf, run, train, test, extra)
        scores["block"][test] = block_model(conf, run, train, test)
        scores["prefix-run"][test] = run_model(conf, run, steps.task, train, test)
    result: dict[str, Any] = {"steps": len(conf), "slots": int(survive.size)}
    result["survival_rate"] = round(float(survive.mean()), 4)
    for name, score in scores.items():
        loss = survive * np.log(np.clip(score, EPS, 1))
        loss += (1 - survive) * np.log(np.clip(1 - score, EPS, 1))
        result[name] = {
            "auc_survival": round(float(auc(score.ravel(), survive.ravel().astype(int)) or 0), 4),
            "log_loss": round(float(-loss.mean()), 4),
            **allocation(score, survive),
        }
    result["oracle"] = {
        f"survivors_per_slot_at_{m:g}x": round(min(1.0, 1 / m), 4) for m in MULTIPLES
    }
    return result


def structure(conf: np.ndarray, run: np.ndarray) -> dict[str, Any]:
    """logit c of accepted positions, first rejections and positions after them."""
    k = conf.shape[1]
    lc = logit(conf)
    j = np.arange(k)[None, :]
    groups = {
        "accepted": j < run[:, None],
        "first_rejection": j == run[:, None],
        "after_rejection": j > run[:, None],
    }
    out = {}
    for name, mask in groups.items():
        values = lc[mask]
        out[name] = {
            "slots": int(mask.sum()),
            "mean_logit": round(float(values.mean()), 3) if len(values) else None,
            "sd_logit": round(float(values.std()), 3) if len(values) else None,
        }
    return out


def synthetic_like(run: np.ndarray, k: int, auc_target: float, seed: int) -> np.ndarray:
    """The synthetic model's confidence for the same runs (docs/synthetic.md)."""
    rng = np.random.default_rng(seed)
    survive = (run[:, None] > np.arange(k)[None, :]).astype(np.float64)
    noise = rng.standard_normal(survive.shape)
    return np.asarray(
        1 / (1 + np.exp(-confidence_logit(survive, noise, separation(auc_target)))),
        dtype=np.float64,
    )


def add_source_arguments(parser: argparse.ArgumentParser, requests: int, steps: int) -> None:
    """RAW or ``--synthetic SET`` (with its size and seed), and ``--out``."""
    parser.add_argument("raw", type=Path, nargs="?", help="bench/draft_confidence.py --raw output")
    parser.add_argument("--synthetic", default=None, help="a synthetic profile set instead of RAW")
    parser.add_argument("--requests", type=int, default=requests, help="--synthetic: per task")
    parser.add_argument("--steps", type=int, default=steps, help="--synthetic: per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")


def steps_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Steps:
    """The steps the arguments name (exactly one source)."""
    if (args.raw is None) == (args.synthetic is None):
        parser.error("give RAW (a --raw file of bench/draft_confidence.py) or --synthetic SET")
    if args.synthetic is not None:
        return synthetic_steps(args.synthetic, args.requests, args.steps, args.seed)
    return load(args.raw)


def report(name: str, part: dict[str, Any]) -> None:
    s = part["structure"]
    print(
        f"{name:>9}: {part['steps']} steps; logit c accepted {s['accepted']['mean_logit']} "
        f"first rejection {s['first_rejection']['mean_logit']} "
        f"after it {s['after_rejection']['mean_logit']}"
    )
    for est in ("prefix", "prefix+task+history", "block", "prefix-run"):
        e = part[est]
        print(
            f"{'':>9}  {est:>19}: AUC {e['auc_survival']} log-loss {e['log_loss']} survivors/slot "
            + " ".join(f"{v}" for key, v in e.items() if key.startswith("surv"))
        )
    print(f"{'':>9}  {'oracle':>19}: " + " ".join(f"{v}" for v in part["oracle"].values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_source_arguments(parser, requests=200, steps=30)
    parser.add_argument("--auc", type=float, default=None, help="mirror's AUC (default: measured)")
    args = parser.parse_args(argv)
    steps = steps_of(args, parser)
    k = steps.conf.shape[1]
    survive = steps.run[:, None] > np.arange(k)[None, :]
    reached = steps.run[:, None] >= np.arange(k)[None, :]
    measured_auc = auc(steps.conf[reached], survive[reached].astype(int)) or 0.5
    # the mirror's model needs an AUC in [0.5, 1)
    target = args.auc if args.auc is not None else min(max(measured_auc, 0.5), 0.999)
    mirror = Steps(
        synthetic_like(steps.run, k, target, args.seed), steps.run, steps.prompt, steps.task
    )
    result: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "source": (args.synthetic and f"synthetic:{args.synthetic}") or str(args.raw),
        "positions": k,
        "auc_uncensored": round(float(measured_auc), 4),
        "mirror_auc": round(float(target), 4),
        "measured": {"structure": structure(steps.conf, steps.run), **evaluate(steps)},
        # the synthetic confidence model drawn on these same runs and requests
        "mirror": {"structure": structure(mirror.conf, mirror.run), **evaluate(mirror)},
        "tasks": {},
    }
    for t in sorted(set(steps.task.tolist())):
        result["tasks"][t] = evaluate(steps.subset(steps.task == t))
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    report("measured", result["measured"])
    report("mirror", result["mirror"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
