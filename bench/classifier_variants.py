"""Training-mix variants of the classifier recipe, scored on the validation split (#17 follow-up).

Each variant is the committed recipe (``training.classifier.training``: SGD linear stage, 5
out-of-fold fits, calibrated combiner) fitted on the training groups less the validation
split, with its own per-source sample weights (``--source-weights`` syntax) and, for
ablations, some sources left out. The features of the whole corpus are computed once and
shared by the variants. Reported per variant: accuracy per source and label on the
validation split, per writing script, the out-of-fold accuracy of the training rows of the
small curated maths sets (more rows than their validation share), the committed prompt
files (hand-written, Cyrillic, Korean, Japanese), the Pygments snippets, and the
calibration error (ECE) on the validation split with the temperature that would minimise
its log loss. The held-out split is never read.

    .venv/bin/python bench/classifier_variants.py --shared-data ../shared/data \\
        --variant 'none=' --variant 'committed=synthetic_math_words=0.5,math500=2,champ=2' \\
        --variant 'no-new-data=;drop=pygments,synthetic_paste,synthetic_code_request' \\
        --out bench/results/classifier_variants_DATE.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.classifier.combiner import Combiner
from controller.classifier.features import FeatureSpec
from controller.classifier.model import LinearClassifier
from policies.types import TASKS
from training.classifier.dataset import Dataset, load_dataset
from training.classifier.evaluation import calibration_error
from training.classifier.prompt_sets import load_prompt_file, request_tags, snippet_examples
from training.classifier.pygments_source import fetch_sdist
from training.classifier.split import is_validation
from training.classifier.stacking import (
    calibrated_combiner,
    combiner_features,
    combiner_logits,
    fit_temperature,
    out_of_fold_features,
)
from training.classifier.training import (
    TrainSettings,
    fit_linear,
    parse_source_weights,
    sample_weights,
    segment_matrices,
    weight_key,
)

ROOT = Path(__file__).resolve().parents[1]
PROMPT_FILES = ("handwritten", "cyrillic", "korean", "japanese")
CURATED = ("gsm8k", "math500", "champ", "mbpp", "human_eval", "mt_bench")


def parse_variant(text: str) -> tuple[str, str, set[str]]:
    """'NAME=WEIGHTS[;drop=SOURCE,...]' -> (name, weights, dropped sources)."""
    name, _, rest = text.partition("=")
    weights, _, drop = rest.partition(";drop=")
    parse_source_weights(weights or None)  # a bad value fails before the data is read
    return name, weights, set(filter(None, drop.split(",")))


def run_variant(
    dataset: Dataset,
    features: tuple[Any, Any, npt.NDArray[np.intp]],
    weights_setting: str,
    dropped: set[str],
    spec: FeatureSpec,
    is_unweighted_combiner: bool = False,
) -> dict[str, Any]:
    segments, sizes, targets = features
    sources = np.array([example.source for example in dataset.examples])
    is_test = np.array(dataset.is_test)
    is_val = np.array([is_validation(example.group, 20) for example in dataset.examples])
    rows = np.where(~is_test & ~is_val & ~np.isin(sources, sorted(dropped)))[0]
    evals = np.where(~is_test & is_val)[0]
    settings = TrainSettings(spec=spec, source_weights=weights_setting or None)
    keys = [weight_key(dataset.examples[i]) for i in rows]
    weights = sample_weights(keys, parse_source_weights(settings.source_weights))
    whole = (segments[0] + segments[1]).tocsr()
    linear = fit_linear(whole[rows], targets[rows], settings, weights)
    row_segments = [segment[rows] for segment in segments]
    oof = out_of_fold_features(
        row_segments, [sizes[rows, 0], sizes[rows, 1]], targets[rows],
        [dataset.examples[i].group for i in rows],
        lambda x, y, w: fit_linear(x, y, settings, w), settings.num_folds, weights,
    )  # fmt: skip
    combiner, temperature = calibrated_combiner(
        oof, targets[rows], settings.num_hidden, settings.seed, weights
    )
    inputs = combiner_features(
        linear, [segment[evals] for segment in segments], [sizes[evals, 0], sizes[evals, 1]]
    )
    logits = combiner_logits(combiner, inputs)
    is_right = np.argmax(logits, axis=1) == targets[evals]
    report: dict[str, Any] = {"weights": weights_setting, "dropped": sorted(dropped)}
    report["temperature"] = temperature
    report["validation"] = validation_cells(dataset, evals, is_right)
    report["calibration"] = calibration_cells(combiner, logits, inputs, targets[evals], is_right)
    report["calibration_by_source"] = calibration_by_source(dataset, evals, logits, is_right)
    if is_unweighted_combiner and weights is not None:
        # The same out-of-fold inputs, the combiner fitted without the sample weights (they
        # stay in the linear stage): does the weighting of the combiner cost calibration?
        plain, plain_temperature = calibrated_combiner(
            oof, targets[rows], settings.num_hidden, settings.seed, None
        )
        plain_logits = combiner_logits(plain, inputs)
        plain_right = np.argmax(plain_logits, axis=1) == targets[evals]
        report["unweighted_combiner"] = {
            "temperature": plain_temperature,
            "validation": validation_cells(dataset, evals, plain_right),
            "calibration": calibration_cells(
                plain, plain_logits, inputs, targets[evals], plain_right
            ),
            "calibration_by_source": calibration_by_source(
                dataset, evals, plain_logits, plain_right
            ),
        }
    oof_right = np.argmax(combiner_logits(combiner, oof), axis=1) == targets[rows]
    report["out_of_fold"] = {
        f"{source}/{TASKS[task]}": cell(oof_right[mask])
        for source in ("math500", "champ", "sharegpt_first")
        for task in range(len(TASKS))
        for mask in [(sources[rows] == source) & (targets[rows] == task)]
        if mask.sum() >= 20
    }
    model = LinearClassifier(
        settings.spec, TASKS, linear.coef_.astype(np.float32),
        linear.intercept_.astype(np.float32), dataset.max_chars, combiner,
    )  # fmt: skip
    report["prompt_files"] = {name: prompt_cells(model, name) for name in PROMPT_FILES}
    snippets = [
        model.classify(example.body).task == example.task
        for example in snippet_examples(fetch_sdist())
    ]
    report["prompt_files"]["pygments snippets"] = {"all": cell(np.array(snippets))}
    return report


def calibration_cells(
    combiner: Combiner,
    logits: npt.NDArray[np.float64],
    inputs: npt.NDArray[np.float64],
    targets: npt.NDArray[np.intp],
    is_right: npt.NDArray[np.bool_],
) -> dict[str, float]:
    """ECE (10 bins) on the validation split at the fitted temperature, and the temperature
    (relative to it) that would minimise the validation log loss, with its ECE: how far a
    refit of the temperature could move calibration. Informational: no variant uses it."""
    refit = fit_temperature(combiner, inputs, targets)
    cells = {"ece": ece(logits, is_right), "validation_temperature": refit}
    cells["ece_at_validation_temperature"] = ece(logits / refit, is_right)
    return cells


def calibration_by_source(
    dataset: Dataset,
    evals: npt.NDArray[np.intp],
    logits: npt.NDArray[np.float64],
    is_right: npt.NDArray[np.bool_],
) -> dict[str, dict[str, float | int]]:
    """Per source (and real / generated): rows, accuracy, mean confidence, and its share of
    the split's over- or under-confidence (the signed gap times the source's share of rows):
    which sources the calibration error comes from."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    confidences = shifted.max(axis=1) / shifted.sum(axis=1)
    groups: dict[str, list[int]] = defaultdict(list)
    for position, index in enumerate(evals):
        source = dataset.examples[index].source
        kind = "generated" if source.startswith("synthetic") else "real"
        for key in (source, kind, "all"):
            groups[key].append(position)
    cells = {}
    for key, positions in sorted(groups.items()):
        chosen = np.array(positions)
        gap = float(confidences[chosen].mean() - is_right[chosen].mean())
        cells[key] = {
            "total": chosen.size,
            "accuracy": float(is_right[chosen].mean()),
            "confidence": float(confidences[chosen].mean()),
            "share_of_gap": gap * chosen.size / len(evals),
        }
    return cells


def ece(logits: npt.NDArray[np.float64], is_right: npt.NDArray[np.bool_]) -> float:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    confidences = shifted.max(axis=1) / shifted.sum(axis=1)
    return calibration_error(list(zip(confidences.tolist(), is_right.tolist(), strict=True)))


def cell(is_right: npt.NDArray[np.bool_]) -> dict[str, float | int]:
    return {"accuracy": float(is_right.mean()) if is_right.size else 0.0, "total": is_right.size}


def validation_cells(
    dataset: Dataset, evals: npt.NDArray[np.intp], is_right: npt.NDArray[np.bool_]
) -> dict[str, dict[str, float | int]]:
    groups: dict[str, list[bool]] = defaultdict(list)
    for index, right in zip(evals, is_right, strict=True):
        example = dataset.examples[index]
        is_real = not example.source.startswith("synthetic")
        script = dict(request_tags(example)).get("script", "none")
        keys = [f"{example.source}/{example.task}", f"script {script}", "all"]
        keys += ["real sources"] * is_real + ["curated sets"] * (example.source in CURATED)
        # The real sources of the rounds before the ChatterBot corpus, for comparison.
        keys += ["real sources without chatterbot"] * (is_real and example.source != "chatterbot")
        for key in keys:
            groups[key].append(bool(right))
    return {key: cell(np.array(values)) for key, values in sorted(groups.items())}


def prompt_cells(model: LinearClassifier, name: str) -> dict[str, dict[str, float | int]]:
    groups: dict[str, list[bool]] = defaultdict(list)
    for example in load_prompt_file(ROOT / "bench" / "classifier_prompts" / f"{name}.jsonl"):
        right = model.classify(example.body).task == example.task
        for key in (f"task {example.task}", f"turns {dict(example.tags).get('turns')}", "all"):
            groups[key].append(right)
    return {key: cell(np.array(values)) for key, values in sorted(groups.items())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared-data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--variant", action="append", required=True, help="NAME=WEIGHTS[;drop=S]")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape-sizes", default="", help="shape view n-gram sizes, e.g. 3,6")
    parser.add_argument(
        "--word-view", default="", help="the word view of every variant: words, words+symbols"
    )
    parser.add_argument(
        "--unweighted-combiner",
        action="store_true",
        help="also fit each weighted variant's combiner without sample weights and score it",
    )
    args = parser.parse_args()
    spec = FeatureSpec(
        shape_sizes=tuple(int(size) for size in filter(None, args.shape_sizes.split(","))),
        word_view=args.word_view,
    )
    variants = [parse_variant(text) for text in args.variant]
    started_s = time.time()
    dataset = load_dataset(args.shared_data)
    segments, sizes = segment_matrices((e.body for e in dataset.examples), spec)
    targets = np.array([TASKS.index(e.task) for e in dataset.examples], dtype=np.int64)
    features = (segments, np.stack(sizes, axis=1), targets)
    results = {}
    for name, weights_setting, dropped in variants:
        results[name] = run_variant(
            dataset, features, weights_setting, dropped, spec, args.unweighted_combiner
        )
        print(name, json.dumps(results[name]["validation"]["real sources"]), flush=True)
        # Written after every variant, so that a long run can be read (or stopped) midway.
        out = {
            "command": " ".join(["bench/classifier_variants.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d"),
            "split": "validation (20% of the training groups); training = the other training "
            "groups",
            "seconds": round(time.time() - started_s),
            "variants": results,
        }
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
