"""``draftctl config check PATH`` and ``draftctl config schema``.

``check`` validates the config file and then the policy file it points to (``policy.path``),
the way ``draftctl serve`` would load it: through ``validate_and_build``, the same check
``PUT /admin/policy`` and the file watcher make, so what passes here is what they accept.
Problems in the policy file are printed in the same ``<dotted.key>: <message> (line N)``
form, prefixed with ``policy file <path>:``. A missing policy file is fine: ``serve``
creates it with the default policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from controller.config import Config, config_schema, load_config
from controller.policy.build import DEFAULT_BLOCK_SIZE, validate_and_build
from controller.policy.document import decode_policy
from engines.config import PoolConfig
from policies.validation import InvalidDocument, Problem


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("config", help="check a config file or print its schema")
    sub = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = sub.add_parser(
        "check",
        help="validate a config file and its policy file: prints ok or one line a problem",
    )
    check.add_argument("path", type=Path)
    check.set_defaults(func=check_command)
    schema = sub.add_parser("schema", help="print the config file's JSON Schema")
    schema.set_defaults(func=schema_command)


def check_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.path)
    except InvalidDocument as exc:
        _print(exc.problems, "")
        return 1
    problems = policy_problems(config)
    if problems:
        _print(problems, f"policy file {config.policy.path}: ")
        return 1
    sys.stdout.write("ok\n")
    return 0


def policy_problems(config: Config) -> list[Problem]:
    """What is wrong with the policy file ``config`` points to (empty: fine or absent)."""
    path = config.policy.path
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [Problem("", f"cannot read it: {exc.strerror}")]
    # An embedded backend's block size comes from its draft model, which check does not load.
    pools = [b.block_size for b in config.backends if isinstance(b, PoolConfig)]
    block_size = max(pools, default=DEFAULT_BLOCK_SIZE)
    try:
        validate_and_build(decode_policy(data), block_size=block_size, base_dir=path.parent)
    except InvalidDocument as exc:
        return exc.problems
    return []


def _print(problems: list[Problem], prefix: str) -> None:
    for problem in problems:
        sys.stdout.write(f"{prefix}{problem}\n")


def schema_command(args: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(config_schema(), indent=2) + "\n")
    return 0
