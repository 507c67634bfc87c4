"""One command per stage: `python -m training <stage> --recipe training/configs/demo.yaml`.

Stages (each writes under --work, default .train/<recipe name>, and skips what is already done):
  tokenizer  byte-level BPE + chat template             (CPU, ~2 min)
  corpus     uint16 token stream + draft prompts        (CPU, ~3 min)
  pair       target pretraining, target continuations, DFlash drafts; exports both (GPU)
  eval       acceptance per task through dflash_generate, traces, bench JSON   (CPU)
"""

import argparse
import logging
import os
import sys
from pathlib import Path

from training.recipe import load_recipe, scale_time

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("stage", choices=["tokenizer", "corpus", "pair", "eval"])
    parser.add_argument("--recipe", type=Path, default=Path("training/configs/demo.yaml"))
    parser.add_argument("--work", type=Path, default=None, help="work folder (.train/<name>)")
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("DRAFTCTL_DATA", DEFAULT_DATA))
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="pair: multiply every time budget (a shortened validation run)",
    )
    parser.add_argument("--out", type=Path, default=None, help="pair: export folder")
    parser.add_argument("--pair", type=Path, default=Path("models/demo"), help="eval: pair folder")
    parser.add_argument("--prompts-per-task", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=None, help="eval: override block size")
    parser.add_argument("--draft", type=Path, default=None, help="eval: draft dir (pair/draft)")
    parser.add_argument("--sources", nargs="*", default=None, help="eval: prompt sources")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="eval: skip the target-only run (no lossless check, no speed-up)",
    )
    parser.add_argument("--device", default="cpu", help="eval: torch device (cpu, cuda)")
    parser.add_argument(
        "--prompts-file",
        type=Path,
        default=None,
        help="eval: JSON {source: [prompt, ...]} from `python -m training.prompts`",
    )
    parser.add_argument("--threads", type=int, default=1, help="eval: torch CPU threads")
    parser.add_argument("--results", type=Path, default=None, help="eval: bench JSON path")
    parser.add_argument("--traces", type=Path, default=None, help="eval: traces JSONL path")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    recipe = scale_time(load_recipe(args.recipe), args.time_scale)
    work = args.work or Path(".train") / recipe.name
    if args.stage == "tokenizer":
        from training.tokenizer import train_tokenizer

        train_tokenizer(recipe, args.data, work / "tokenizer")
    elif args.stage == "corpus":
        from training.corpus import build_corpus

        build_corpus(recipe, args.data, work / "tokenizer", work / "corpus")
    elif args.stage == "pair":
        from training.pair import train_pair

        train_pair(recipe, work, args.out or work / "export")
    else:
        from training.evaluate import evaluate_pair

        evaluate_pair(args, args.pair)
    return 0


if __name__ == "__main__":
    sys.exit(main())
