"""``draftctl classify``: classify texts or a JSONL file of requests with the built-in model."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from controller.classifier.artifact import ArtifactError, load_classifier


class JsonlError(ValueError):
    """A --jsonl line that is not a request; the message names the file and line."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "classify", help="classify prompts as math, code or chat (one JSON object per input)"
    )
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="prompts to classify")
    parser.add_argument(
        "--jsonl", type=Path, help='file of requests, one per line, with "prompt" or "messages"'
    )
    parser.add_argument("--json", action="store_true", help="include per-class scores and latency")
    parser.add_argument("--artifact", type=Path, help="artifact folder (default: built-in)")
    parser.set_defaults(func=run)


def read_jsonl(path: Path) -> Iterator[Mapping[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield parse_line(line, f"{path}:{number}")


def parse_line(line: str, where: str) -> Mapping[str, Any]:
    try:
        body = json.loads(line)
    except json.JSONDecodeError as error:
        raise JsonlError(f"{where}: not JSON ({error.msg}); each line must be one object") from None
    if not isinstance(body, dict) or ("prompt" not in body and "messages" not in body):
        raise JsonlError(f'{where}: expected an object with "prompt" or "messages"')
    if "messages" in body and not isinstance(body["messages"], list):
        raise JsonlError(f'{where}: "messages" must be a list of {{"role", "content"}} objects')
    return body


def run(args: argparse.Namespace) -> int:
    if not args.texts and args.jsonl is None:
        print("draftctl classify: give TEXT arguments or --jsonl FILE", file=sys.stderr)
        return 2
    try:
        classifier = load_classifier(args.artifact)
        bodies: list[Mapping[str, Any]] = [{"prompt": text} for text in args.texts]
        if args.jsonl is not None:
            bodies.extend(read_jsonl(args.jsonl))
    except (ArtifactError, JsonlError, OSError) as error:
        print(f"draftctl classify: {error}", file=sys.stderr)
        return 2
    for body in bodies:
        guess = classifier.classify(body)
        result: dict[str, Any] = {"task": str(guess.task), "confidence": round(guess.confidence, 4)}
        if args.json:
            result["scores"] = {str(t): round(s, 4) for t, s in guess.scores.items()}
            result["latency_us"] = round(guess.latency_s * 1e6, 1)
        print(json.dumps(result))
    return 0
