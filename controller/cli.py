"""The ``draftctl`` command line.

Each subcommand lives in its own module under ``controller.commands`` and exposes
``register(subparsers)``; this file only assembles them, importing each lazily so that
``draftctl --help`` stays fast and needs no torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Module names under controller.commands, in the order --help lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "serve",
    "config",
    "simulate",
    "bench",
    "plan",
    "policy",
    "generate",
    "classify",
    "classifier",
    "profile",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftctl",
        description="Adaptive draft-length controller for DFlash speculative decoding.",
    )
    parser.add_argument("--log-level", default="info", help="logging level (default: info)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"controller.commands.{name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
