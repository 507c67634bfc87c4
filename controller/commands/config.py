"""``draftctl config check PATH`` and ``draftctl config schema``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from controller.config import config_schema, load_config
from policies.validation import InvalidDocument


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("config", help="check a config file or print its schema")
    sub = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="validate a config file: prints ok or one line a problem")
    check.add_argument("path", type=Path)
    check.set_defaults(func=check_command)
    schema = sub.add_parser("schema", help="print the config file's JSON Schema")
    schema.set_defaults(func=schema_command)


def check_command(args: argparse.Namespace) -> int:
    try:
        load_config(args.path)
    except InvalidDocument as exc:
        for problem in exc.problems:
            sys.stdout.write(f"{problem}\n")
        return 1
    sys.stdout.write("ok\n")
    return 0


def schema_command(args: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(config_schema(), indent=2) + "\n")
    return 0
