"""``draftctl classifier train|eval``: build and measure the traffic classifier.

The work is offline code in ``training.classifier``, imported only when one of these runs, so
the daemon's start-up (every ``draftctl`` command registers this one) never loads it.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("classifier", help="train or evaluate the task classifier")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = actions.add_parser("train", help="train and write an artifact (needs training data)")
    _add_data_args(train)
    train.add_argument(
        "--out", type=Path, default=None, help="artifact folder (default: the built-in one)"
    )
    train.add_argument("--seed", type=int, default=0, help="optimiser seed (default: 0)")
    train.add_argument(
        "--alpha", type=float, default=None, help="L2 penalty (default: TrainSettings.alpha)"
    )
    train.add_argument(
        "--class-weight",
        default=None,
        help="class weighting: none, balanced, or TASK=WEIGHT[,TASK=WEIGHT] such as code=2 "
        "(default: TrainSettings.class_weight)",
    )
    train.add_argument(
        "--source-weights",
        default=None,
        help="sample weights by prefix of SOURCE/LABEL, PREFIX=WEIGHT[,PREFIX=WEIGHT] such as "
        "synthetic=0.5 or sharegpt_first/math=3; 'none' weighs every example 1 "
        "(default: TrainSettings.source_weights)",
    )
    train.add_argument(
        "--num-bits", type=int, default=None, help="log2 of the number of hash buckets"
    )
    train.add_argument(
        "--ngram-sizes",
        default=None,
        help="comma-separated byte n-gram sizes (default: FeatureSpec.ngram_sizes)",
    )
    train.add_argument(
        "--shape-sizes",
        default=None,
        help="comma-separated n-gram sizes of the shape view (letters, digits and blanks "
        "folded, punctuation kept), e.g. 3,6; 'none' for no shape view (default: none)",
    )
    train.add_argument(
        "--word-view",
        default=None,
        choices=("none", "words", "words+symbols"),
        help="ASCII word tokens (tool names, keywords, numbers) scored with their own "
        "normalisation; 'words+symbols' adds punctuation bytes as tokens; 'none' for no "
        "word view (default: words)",
    )
    train.add_argument(
        "--no-segments",
        action="store_true",
        help="hash the whole request as one text (the pre-segment model, for comparison)",
    )
    train.add_argument(
        "--num-hidden",
        type=int,
        default=None,
        help="hidden units of the combiner MLP; 0 adds the segment scores instead "
        "(default: TrainSettings.num_hidden)",
    )
    train.add_argument(
        "--temperature-scale",
        type=float,
        default=None,
        help="multiplies the combiner's calibration temperature fitted on its out-of-fold "
        "rows; 1 keeps the fitted one (default: TrainSettings.temperature_scale)",
    )
    train.set_defaults(func=run_train)
    evaluate = actions.add_parser("eval", help="score an artifact on the held-out split")
    _add_data_args(evaluate)
    evaluate.add_argument(
        "--artifact", type=Path, default=None, help="artifact folder (default: built-in)"
    )
    evaluate.add_argument(
        "--list-errors",
        type=int,
        default=0,
        metavar="N",
        help="also print N misclassified real-source requests, drawn at random (seed 0)",
    )
    evaluate.add_argument("--no-latency", action="store_true", help="skip the latency measurement")
    evaluate.add_argument(
        "--prompts",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="also score a JSON-lines prompt set (task, messages or prompt, optional "
        "human_language / programming_language / register / turns); repeatable, e.g. "
        "bench/classifier_prompts/handwritten.jsonl",
    )
    evaluate.add_argument(
        "--snippets",
        action="store_true",
        help="also score the Pygments sdist's tests/snippets (never trained on) as code",
    )
    evaluate.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the report as JSON (per source and label: counts, accuracy and its "
        "noise; per class precision and recall; the confusion matrix)",
    )
    evaluate.set_defaults(func=run_eval)


def _add_data_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shared-data",
        type=Path,
        default=None,
        help="folder with gsm8k/, mbpp/, math500/, mt_bench/ (default: ../shared/data)",
    )
    parser.add_argument(
        "--held-out-percent",
        type=int,
        default=None,
        help="percent of groups held out by hash (default: 20; must match training)",
    )
    parser.add_argument(
        "--validation-percent",
        type=int,
        default=0,
        help="train: leave this percent of the training groups out; eval: score those "
        "validation groups instead of the held-out split (default: 0 = off; use the same "
        "value for both; choose models this way, never on the held-out split)",
    )


def with_data_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``--shared-data`` and ``--held-out-percent`` filled in from ``training.classifier``
    when not given (the defaults live there, beside the corpus and the split)."""
    from training.classifier.corpus import DEFAULT_SHARED_DATA
    from training.classifier.split import DEFAULT_HELD_OUT_PERCENT

    if args.shared_data is None:
        args.shared_data = DEFAULT_SHARED_DATA
    if args.held_out_percent is None:
        args.held_out_percent = DEFAULT_HELD_OUT_PERCENT
    return args


def run_train(args: argparse.Namespace) -> int:
    from controller.classifier.artifact import builtin_artifact_dir
    from training.classifier.corpus import MissingDataError
    from training.classifier.dataset import load_dataset
    from training.classifier.training import train

    args = with_data_defaults(args)
    out = args.out or builtin_artifact_dir()
    try:
        settings = settings_from(args)
    except ValueError as error:
        logger.error("%s", error)
        return 2
    try:
        dataset = load_dataset(args.shared_data, args.held_out_percent)
    except MissingDataError as error:
        logger.error("%s", error)
        return 2
    num_test = sum(dataset.is_test)
    logger.info("examples: %d train, %d held out", len(dataset.texts) - num_test, num_test)
    train(dataset, settings, args.shared_data, out, is_progress=True)
    logger.info("wrote %s", out)
    return 0


def settings_from(args: argparse.Namespace) -> Any:
    from training.classifier.training import TrainSettings, class_weights, parse_source_weights

    settings = TrainSettings(seed=args.seed, validation_percent=args.validation_percent)
    if args.alpha is not None:
        settings = replace(settings, alpha=args.alpha)
    if args.class_weight is not None:
        weighting = None if args.class_weight == "none" else args.class_weight
        class_weights(weighting)  # a bad value fails here, before the data is read
        settings = replace(settings, class_weight=weighting)
    if args.source_weights is not None:
        source_weights = None if args.source_weights == "none" else args.source_weights
        parse_source_weights(source_weights)  # a bad value fails here, before the data is read
        settings = replace(settings, source_weights=source_weights)
    spec = settings.spec
    if args.ngram_sizes:
        spec = replace(spec, ngram_sizes=tuple(int(size) for size in args.ngram_sizes.split(",")))
    if args.num_bits is not None:
        spec = replace(spec, num_bits=args.num_bits)
    if args.shape_sizes:
        sizes = () if args.shape_sizes == "none" else args.shape_sizes.split(",")
        spec = replace(spec, shape_sizes=tuple(int(size) for size in sizes))
    if args.word_view is not None:
        spec = replace(spec, word_view="" if args.word_view == "none" else args.word_view)
    if args.no_segments:
        spec = replace(spec, is_segmented=False)
    if args.num_hidden is not None:
        settings = replace(settings, num_hidden=args.num_hidden)
    if args.temperature_scale is not None:
        if not args.temperature_scale > 0:
            raise ValueError(f"--temperature-scale {args.temperature_scale}: must be > 0")
        settings = replace(settings, temperature_scale=args.temperature_scale)
    return replace(settings, spec=spec)


def run_eval(args: argparse.Namespace) -> int:
    from controller.classifier.artifact import ArtifactError, load_classifier
    from training.classifier.corpus import MissingDataError
    from training.classifier.dataset import load_dataset
    from training.classifier.evaluation import (
        evaluate,
        format_errors,
        format_report,
        report_json,
    )

    args = with_data_defaults(args)
    try:
        classifier = load_classifier(args.artifact)
        dataset = load_dataset(args.shared_data, args.held_out_percent)
        extra_sets = extra_examples(args)
    except (ArtifactError, MissingDataError, ValueError) as error:
        logger.error("%s", error)
        return 2
    if args.validation_percent:
        print(f"validation split: {args.validation_percent}% of the training groups")
    examples = [dataset.examples[i] for i in dataset.eval_rows(args.validation_percent)]
    report = evaluate(classifier, examples)
    print(format_report(report, has_latency=False))
    extra_reports = {}
    for name, extra in extra_sets.items():
        extra_reports[name] = evaluate(classifier, extra)
        print(f"\n== {name} ==")
        print(format_report(extra_reports[name], has_latency=False))
    if args.json is not None:
        split = "validation" if args.validation_percent else "held-out"
        document = {
            "command": "draftctl " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d"),
            "artifact": str(args.artifact or "built-in"),
            "split": split,
            "held_out_percent": args.held_out_percent,
            "validation_percent": args.validation_percent,
            **report_json(report),
            "prompt_sets": {name: report_json(extra) for name, extra in extra_reports.items()},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.list_errors:
        print(format_errors(classifier, examples, args.list_errors))
    return 0 if args.no_latency else measure_latency(examples, args.artifact)


def extra_examples(args: argparse.Namespace) -> dict[str, list[Any]]:
    """The sets of ``--prompts`` and ``--snippets``, by name."""
    from training.classifier.prompt_sets import load_prompt_file, snippet_examples
    from training.classifier.pygments_source import fetch_sdist

    sets: dict[str, list[Any]] = {str(path): load_prompt_file(path) for path in args.prompts}
    if args.snippets:
        sets["pygments snippets"] = snippet_examples(fetch_sdist())
    return sets


def measure_latency(examples: list[Any], artifact: Path | None) -> int:
    """Time the held-out requests in a child process (see training/classifier/latency.py)."""
    with tempfile.TemporaryDirectory() as folder:
        requests = Path(folder) / "held_out.jsonl"
        with requests.open("w", encoding="utf-8") as out:
            for example in examples:
                out.write(json.dumps(example.body) + "\n")
        command = [sys.executable, "-m", "training.classifier.latency", str(requests)]
        if artifact is not None:
            command += ["--artifact", str(artifact)]
        return subprocess.run(command, check=False).returncode
