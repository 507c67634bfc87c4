"""``draftctl simulate``: compare policies on a simulated continuous-batching server."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from controller.commands.whatif import add_replay_arguments, run_replay

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate no-spec, static k, goodput and an oracle (or fleets) on a scenario",
        description=(
            "Discrete-event simulation of a continuous-batching DFlash server. Every policy "
            "runs on the same requests; prints goodput, TPOT and TTFT per policy per phase "
            "(the JSON also the mean request latency). Phases are closed-loop clients "
            "(concurrency) or open-loop arrivals (arrival_rate, seeded Poisson; fleets are then "
            "compared by mean request latency). A scenario with a `fleet` section simulates "
            "fleets of instances behind a router instead (uniform fleets and task pools; "
            "docs/fleet.md) and prints one entry per fleet under `fleets`."
        ),
    )
    parser.add_argument("--scenario", type=Path, help="scenario YAML file")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--out", type=Path, help="also write the JSON report to this file")
    parser.add_argument("--plot", type=Path, metavar="DIR", help="write PNG plots into DIR")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_replay_arguments(parser)
    parser.set_defaults(func=run)


def read_scenario(path: Path) -> Any | None:
    """The scenario at ``path``, or None after logging every problem with it."""
    from policies.validation import InvalidDocument
    from sim.scenario import load_scenario

    try:
        return load_scenario(path)
    except InvalidDocument as exc:
        for problem in exc.problems:
            logger.error("%s: %s", path, problem)
    except OSError as exc:
        logger.error("cannot read scenario %s: %s", path, exc)
    return None


def run(args: argparse.Namespace) -> int:
    if args.replay is not None:
        return run_replay(args)
    if args.scenario is None:
        logger.error("give --scenario FILE, or --replay TRACE --policy FILE")
        return 2
    scenario = read_scenario(args.scenario)
    if scenario is None:
        return 2
    try:
        report = _simulate(scenario, show_progress=not args.no_progress)
    except ValueError as exc:
        logger.error("scenario %s: %s", args.scenario, exc)
        return 2
    _emit(report, args)
    return 0


def _simulate(scenario: Any, show_progress: bool) -> dict[str, Any]:
    from tqdm import tqdm

    from sim.fleet_runner import layouts_of, run_fleets
    from sim.runner import run_scenario

    if scenario.fleet is not None:
        total = scenario.duration_s * len(layouts_of(scenario))
    else:
        total = scenario.duration_s * (len(scenario.policies.static_spec_tokens) + 3)
    disable = not show_progress or not sys.stderr.isatty()
    with tqdm(total=round(total), unit="sim-s", disable=disable, file=sys.stderr) as bar:
        if scenario.fleet is not None:
            return run_fleets(scenario, progress=bar.update)
        return run_scenario(scenario, progress=bar.update)


def _emit(report: dict[str, Any], args: argparse.Namespace) -> None:
    from sim.fleet_report import format_fleet_report
    from sim.report import format_report

    is_fleet = "fleets" in report
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if args.plot is not None:
        from sim.fleet_plot import write_fleet_plots
        from sim.plot import write_plots

        for path in (write_fleet_plots if is_fleet else write_plots)(report, args.plot):
            logger.info("wrote %s", path)
    table = format_fleet_report(report) if is_fleet else format_report(report)
    sys.stdout.write((text if args.json else table) + "\n")
