"""Read classifier errors by hand and estimate the accuracy ceiling of the labels.

Two steps (docs/classifier.md, "Audit of validation errors"):

1. ``--sample N --out FILE``: classify a split with an artifact, draw N of its real-source
   errors at random (``--seed``) and write them to FILE, one JSON object a line, with an
   empty ``verdict``. Nothing of the request's text goes into FILE: a line names the example
   by its index in ``load_dataset`` order and the sha256 of its group.
2. A reader fills each ``verdict`` with ``readable`` (a careful reader of the request would
   give the label), ``undetermined`` (the request does not say what the answer will be),
   or ``label`` (the label is wrong or doubtful by the label rules); then
   ``--verdicts FILE`` prints the tally and the ceiling it implies: the accuracy of a
   classifier that made none of the readable errors, ``1 - error rate x (1 - readable share)``,
   with a 95% interval for the share. ``--show`` prints each request again with its verdict.

The dataset is rebuilt from ``--shared-data`` and the data packages, so FILE stays valid as
long as the corpus is the same (each line's group hash is checked).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from controller.classifier.artifact import load_classifier
from controller.classifier.text import request_segments
from training.classifier.corpus import DEFAULT_SHARED_DATA
from training.classifier.dataset import Dataset, load_dataset
from training.classifier.evaluation import real_errors, snippet

VERDICTS = ("readable", "undetermined", "label")


def group_sha(group: str) -> str:
    return hashlib.sha256(group.encode("utf-8")).hexdigest()[:16]


def sample(args: argparse.Namespace, dataset: Dataset) -> int:
    rows = dataset.eval_rows(args.validation_percent)
    examples = [dataset.examples[i] for i in rows]
    errors = [
        (rows[position], guess.task)
        for position, guess in real_errors(load_classifier(args.artifact), examples)
    ]
    num_real = sum(not example.source.startswith("synth") for example in examples)
    print(
        f"{len(errors)} errors of {num_real} real-source requests "
        f"({len(errors) / max(num_real, 1):.2%})"
    )
    order = np.random.default_rng(args.seed).permutation(len(errors))[: args.sample]
    with args.out.open("w", encoding="utf-8") as out:
        for position in order:
            index, guess = errors[int(position)]
            example = dataset.examples[index]
            line = {
                "index": index, "group_sha": group_sha(example.group), "source": example.source,
                "label": example.task.value, "guess": guess.value, "verdict": "",
            }  # fmt: skip
            out.write(json.dumps(line) + "\n")
    print(f"wrote {len(order)} errors to {args.out}")
    return 0


def read_verdicts(path: Path, dataset: Dataset) -> list[dict[str, Any]]:
    lines = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            index = int(line["index"])
            sha, verdict = line["group_sha"], line["verdict"]
        except (ValueError, KeyError, TypeError) as error:
            raise SystemExit(
                f"{path}:{number}: expected a JSON object with index, group_sha and "
                f"verdict ({error})"
            ) from None
        if not 0 <= index < len(dataset.examples):
            raise SystemExit(f"{path}:{number}: index {index} is not in the dataset")
        if group_sha(dataset.examples[index].group) != sha:
            raise SystemExit(f"{path}:{number}: the corpus changed (group hash differs)")
        if verdict not in VERDICTS:
            raise SystemExit(
                f"{path}:{number}: verdict {verdict!r} is not one of {', '.join(VERDICTS)}"
            )
        lines.append(line)
    if not lines:
        raise SystemExit(f"{path}: no verdicts in it")
    return lines


def ceilings(error_rate: float, num_readable: int, num_read: int) -> tuple[float, float, float]:
    """The accuracy of a classifier that made none of the readable errors, and its 95%
    interval (Wald, from the readable share of ``num_read`` errors read)."""
    share = num_readable / num_read
    half = 1.96 * math.sqrt(share * (1 - share) / num_read)
    return (
        1 - error_rate * (1 - share),
        max(0.0, 1 - error_rate * (1 - share + half)),
        min(1.0, 1 - error_rate * (1 - share - half)),
    )


def tally(args: argparse.Namespace, dataset: Dataset) -> int:
    lines = read_verdicts(args.verdicts, dataset)
    if args.show:
        for number, line in enumerate(lines):
            example = dataset.examples[line["index"]]
            focus, context = request_segments(example.body, dataset.max_chars)
            print(
                f"#{number} {line['verdict']}: {example.source} "
                f"label={line['label']} guess={line['guess']}"
            )
            print(f"  request: {snippet(focus, 360)}")
            if context:
                print(f"  context: {snippet(context, 200)}")
            if example.answer:
                print(f"  answer:  {snippet(example.answer, 220)}")
    counts = Counter(line["verdict"] for line in lines)
    total = len(lines)
    for verdict in VERDICTS:
        print(f"{verdict:13} {counts[verdict]:4d}  {counts[verdict] / total:6.1%}")
    for error_rate in args.error_rate:
        ceiling, low, high = ceilings(error_rate, counts["readable"], total)
        print(
            f"error rate {error_rate:.2%}: a reader who made none of the readable errors "
            f"would score {ceiling:.2%} (95% interval {low:.2%}-{high:.2%})"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shared-data",
        type=Path,
        default=DEFAULT_SHARED_DATA,
        help="folder with gsm8k/, mbpp/, math500/, mt_bench/ (../shared/data)",
    )
    parser.add_argument(
        "--validation-percent",
        type=int,
        default=0,
        help="sample the validation split of this size (0: the held-out split)",
    )
    parser.add_argument("--artifact", type=Path, help="classifier folder (default: built-in)")
    parser.add_argument("--sample", type=int, metavar="N", help="draw N errors into --out")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw")
    parser.add_argument("--out", type=Path, help="where --sample writes")
    parser.add_argument("--verdicts", type=Path, help="a filled-in sample file to tally")
    parser.add_argument(
        "--error-rate",
        type=float,
        nargs="*",
        default=[],
        help="real-source error rates to turn into ceilings, e.g. 0.048",
    )
    parser.add_argument("--show", action="store_true", help="print each request with --verdicts")
    args = parser.parse_args(argv)  # fmt: skip
    if (args.sample is None) == (args.verdicts is None):
        parser.error("give either --sample N --out FILE or --verdicts FILE")
    if args.sample is not None and args.out is None:
        parser.error("--sample needs --out FILE")
    if args.verdicts is not None and not args.verdicts.is_file():
        parser.error(f"--verdicts {args.verdicts}: no such file")
    dataset = load_dataset(args.shared_data)
    return sample(args, dataset) if args.sample is not None else tally(args, dataset)


if __name__ == "__main__":
    sys.exit(main())
