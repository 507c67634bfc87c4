"""What misclassification costs in goodput: the simulator's goodput policy fed classifier
labels instead of the true task (issue #17).

Each simulated request of true task t gets the classifier's answer to a real prompt of task t,
drawn (seeded, per request) from an evaluation set scored by an artifact: the task probabilities,
and the label after ``min_confidence`` (``apply_threshold``). Three ways to use them, each a
goodput chooser (the real ``GoodputPolicy`` and ``OnlineModels``, per-request k as at the
gateway; the online models record each request under the task the daemon would record):

- ``oracle-labels``: the true task (the simulator's own goodput chooser);
- ``hard``: the thresholded label's priors (the daemon before #17);
- ``mixture``: the probability-weighted mixture of the tasks' priors (``policies.task_mixture``;
  the gateway since #17).

Usage::

    .venv/bin/python bench/classifier_goodput.py --scenario scenarios/mixed-shift-parametric.yaml \\
        --prompts bench/classifier_prompts/handwritten.jsonl --artifact DIR [--artifact DIR2] \\
        --seeds 0 1 2 --out bench/results/classifier_goodput_DATE.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout, not the editable install

from controller.classifier import apply_threshold, load_classifier  # noqa: E402
from engines.cost_tables import load_cost_table  # noqa: E402
from policies.task_mixture import CERTAIN_PROBABILITY, mixed_observation_fields  # noqa: E402
from policies.types import Task  # noqa: E402
from sim.choosers import GoodputChooser  # noqa: E402
from sim.request import SimRequest  # noqa: E402
from sim.runner import engine_cost  # noqa: E402
from sim.scenario import load_scenario  # noqa: E402
from sim.server import SimServer  # noqa: E402
from sim.workload import Workload  # noqa: E402
from training.classifier.prompt_sets import load_prompt_file  # noqa: E402

Guess = tuple[Task, dict[Task, float]]  # thresholded label, probabilities


class ClassifiedGoodput(GoodputChooser):
    """GoodputChooser that sees the classifier's answer for each request, not its task."""

    def __init__(
        self,
        name: str,
        guesses: dict[Task, list[Guess]],
        is_mixture: bool,
        draw_seed: int,
        *args: Any,
    ) -> None:
        super().__init__(*args)
        self.name = name
        self._guesses = guesses
        self._is_mixture = is_mixture
        self._draw_seed = draw_seed
        self._labels: dict[tuple[int, int, int], Guess] = {}

    def label(self, request: SimRequest) -> Guess:
        key = request.spec.key
        if key not in self._labels:  # the same draw for a request in every chooser
            rng = random.Random(f"{self._draw_seed}:{key}")
            self._labels[key] = rng.choice(self._guesses[request.spec.task])
        return self._labels[key]

    def task_of(self, request: SimRequest) -> Task:
        return self.label(request)[0]

    def fields_of(
        self, request: SimRequest, observed: dict[Task, dict[str, Any]]
    ) -> dict[str, Any]:
        task, scores = self.label(request)
        if self._is_mixture and max(scores.values()) < CERTAIN_PROBABILITY:
            by_task = {other: self.observed(other, observed) for other in scores}
            return mixed_observation_fields(by_task, scores, task)
        return self.observed(task, observed)


def classifier_guesses(artifact: str | None, prompts: Path) -> dict[Task, list[Guess]]:
    """Per true task, the artifact's (thresholded label, probabilities) on the prompt set."""
    classifier = load_classifier(artifact)
    guesses: dict[Task, list[Guess]] = {task: [] for task in Task}
    for example in load_prompt_file(prompts):
        guess = apply_threshold(classifier.classify(example.body), 0.55, Task.CHAT)
        guesses[example.task].append((guess.task, dict(guess.scores)))
    return guesses


def simulate(scenario_path: Path, guesses: dict[Task, list[Guess]], seed: int) -> dict[str, float]:
    loaded = load_scenario(scenario_path)
    # per-request k, as the gateway decides it
    cost = loaded.cost.model_copy(update={"batch_verify": "ragged"})
    scenario = loaded.model_copy(update={"seed": seed, "cost": cost})
    table = load_cost_table(scenario.resolve(scenario.cost.table))
    workload = Workload(scenario)
    chosen = scenario.policies
    min_k = min(chosen.min_spec_tokens, scenario.block_size - 1)
    common = (chosen.goodput, table, scenario.block_size, seed, min_k)
    choosers = [
        GoodputChooser(*common),
        ClassifiedGoodput("hard", guesses, False, seed, *common),
        ClassifiedGoodput("mixture", guesses, True, seed, *common),
    ]
    goodput = {}
    for chooser in choosers:
        server = SimServer(scenario, workload, chooser, engine_cost(scenario, table))
        name = "oracle-labels" if chooser.name == "goodput" else chooser.name
        goodput[name] = server.run().as_dict()["goodput_tok_s"]
    return goodput


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument(
        "--artifact",
        action="append",
        default=[],
        help="artifact folder; 'builtin' for the built-in one; repeatable",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    document: dict[str, Any] = {
        "command": " ".join([sys.executable, *sys.argv]),
        "date": time.strftime("%Y-%m-%d"),
        "scenario": str(args.scenario),
        "prompts": str(args.prompts),
        "artifacts": {},
    }
    for artifact in args.artifact or ["builtin"]:
        guesses = classifier_guesses(None if artifact == "builtin" else artifact, args.prompts)
        runs = [simulate(args.scenario, guesses, seed) for seed in args.seeds]
        accuracy = {
            str(task): sum(g[0] == task for g in rows) / max(1, len(rows))
            for task, rows in guesses.items()
        }
        ratios = {
            name: [run[name] / run["oracle-labels"] for run in runs] for name in ("hard", "mixture")
        }
        document["artifacts"][artifact] = {
            "recall": accuracy,
            "runs": runs,
            "vs_oracle_labels": ratios,
        }
        print(artifact, json.dumps(ratios))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
