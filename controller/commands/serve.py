"""``draftctl serve [--config PATH] [--host H] [--port P]``: run the daemon."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvloop

from controller.config import load_config
from controller.server import Server, StartupError
from policies.validation import InvalidDocument

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help="run the daemon (OpenAI-compatible gateway)")
    parser.add_argument("--config", type=Path, default=Path("config.yaml"), help="config file")
    parser.add_argument("--host", default=None, help="listen address (default: server.host)")
    parser.add_argument("--port", type=int, default=None, help="listen port (default: server.port)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except InvalidDocument as exc:
        for problem in exc.problems:
            log.error("%s: %s", args.config, problem)
        return 1
    try:
        server = Server(config, host=args.host, port=args.port)
    except InvalidDocument as exc:
        for problem in exc.problems:
            log.error("policy file %s: %s", config.policy.path, problem)
        return 1
    try:
        uvloop.run(server.serve())
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0
