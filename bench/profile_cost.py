"""Run ``draftctl profile-cost`` without the daemon's other subcommands.

``draftctl`` builds every subcommand's parser, and ``serve`` imports the HTTP stack, which the
GPU image lacks; this registers only ``profile-cost`` (controller/commands/profile.py, the same
code and the same JSON, its ``command`` field reading ``draftctl profile-cost ...``):

    python3 bench/profile_cost.py profile-cost --target DIR --out FILE [options as draftctl's]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.commands import profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draftctl")
    profile.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
