"""``draftctl plan``: a pool layout and per-pool k schedules for a fleet, from its traffic."""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="recommend a pool layout and per-pool k schedules for a fleet of N servers",
        description=(
            "Simulates uniform fleets (no speculation, each static k, one batch-size schedule) "
            "and task pools (every grouping of math/code/chat into 2-3 pools, every split of "
            "the instances, each pool with the num_speculative_tokens_per_batch_size schedule "
            "export-schedule fits to its tasks) on the traffic described by a scenario file "
            "(phases of clients and task mix, lengths, acceptance traces or parametric rates, "
            "cost table; docs/fleet.md), shortened by --search-scale; re-simulates the top 3 "
            "and the best uniform fleet at full length and recommends the best there (by "
            "goodput for phases of clients, by mean request latency for phases of arrival "
            "rates; a pooled layout must beat the best uniform fleet by 0.5%), with its gain, and "
            "writes the vLLM/SGLang launch commands and the matching draftctl config and "
            "policy files. With --traffic-log the traffic comes from a daemon's recorded trace "
            "instead (recording.enabled): windows of its arrival rate (or, --loop, its "
            "clients) and task mix, its drafted requests' lengths and acceptance "
            "(docs/fleet.md)."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--traffic", type=Path, help="scenario YAML describing the traffic")
    source.add_argument(
        "--traffic-log",
        type=Path,
        help="the daemon's served trace (file, with its rotated files, or a folder of them)",
    )
    log = parser.add_argument_group("with --traffic-log")
    log.add_argument(
        "--window-s",
        type=float,
        default=60.0,
        help="seconds of the trace per simulated phase (its arrival rate and mix; default 60)",
    )
    log.add_argument("--last", type=float, help="keep only the trace's newest seconds")
    log.add_argument(
        "--loop",
        choices=("auto", "open", "closed"),
        default="auto",
        help="phases as arrival rates (open) or as clients, the requests in flight (closed); "
        "auto (default): closed when requests arrive within 0.25 s of another's end (clients "
        "sending their next one) well beyond what independent arrivals would by chance; open "
        "when traffic is too busy to tell",
    )
    log.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        help="multiply the recorded arrival rates, or clients (plan for growth; default 1)",
    )
    log.add_argument(
        "--cost-table",
        type=Path,
        help="the servers' cost table (draftctl profile-cost); default: the trace header's",
    )
    log.add_argument(
        "--max-batch-size",
        type=int,
        help="the planned servers' batch limit (vLLM max_num_seqs; default: the trace header's)",
    )
    log.add_argument(
        "--draft-cost-fraction",
        type=float,
        default=0.16,
        help="the draft forward's cost as a share of a full-block target forward (default 0.16)",
    )
    parser.add_argument(
        "--instances", type=int, help="servers in the fleet (default: the file's fleet.instances)"
    )
    parser.add_argument(
        "--out-dir", type=Path, help="write plan.json, config, policy, launch files"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    parser.add_argument(
        "--search-scale",
        type=float,
        default=0.25,
        help="phase durations x this for the search (default 0.25); finalists run at full length",
    )
    parser.add_argument(
        "--spill-margin",
        type=_spill_margin,
        help=(
            "plan with load spill: a request leaves its home pool when that pool holds more "
            "than this many in-flight requests per server above the least-loaded pool (written "
            "to policy.yaml as spill_margin); 'auto': try every task-pool layout with no spill "
            "and with 0, 1, 2, 4 and 8 and write the recommended one's; default: route by "
            "task only"
        ),
    )
    parser.add_argument("--model", default="model", help="served model name clients address")
    parser.add_argument("--target", default="TARGET", help="target model path for the servers")
    parser.add_argument("--draft", default="DRAFT", help="DFlash draft path for the servers")
    parser.add_argument("--host", default="127.0.0.1", help="host of the planned servers")
    parser.add_argument("--base-port", type=int, default=8101, help="first server port")
    parser.add_argument("--no-progress", action="store_true", help="hide progress messages")
    parser.set_defaults(func=run)


def _spill_margin(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: use a whole number >= 0, or auto")
    return value


def run(args: argparse.Namespace) -> int:
    if not 0 < args.search_scale <= 1:
        logger.error("--search-scale must be in (0, 1], got %s", args.search_scale)
        return 2
    if args.instances is not None and args.instances < 1:
        logger.error("--instances must be >= 1, got %s", args.instances)
        return 2
    if args.traffic_log is None:
        return _run(args, args.traffic, None)
    if not 0 <= args.draft_cost_fraction <= 1:
        logger.error("--draft-cost-fraction must be in [0, 1], got %s", args.draft_cost_fraction)
        return 2
    if args.max_batch_size is not None and args.max_batch_size < 1:
        logger.error("--max-batch-size must be >= 1, got %s", args.max_batch_size)
        return 2
    if args.out_dir is not None:
        return _from_log(args, args.out_dir)
    with tempfile.TemporaryDirectory(prefix="draftctl-plan-") as scratch:
        return _from_log(args, Path(scratch))


def _from_log(args: argparse.Namespace, folder: Path) -> int:
    """Describe the recorded traffic as a scenario in ``folder`` (traffic.yaml), then plan."""
    from sim.replay import TraceError
    from sim.traffic_log import read_traffic, write_traffic

    try:
        traffic = read_traffic(
            args.traffic_log, args.window_s, args.last, args.rate_scale, args.loop
        )
        path = write_traffic(
            traffic,
            folder,
            args.cost_table,
            args.instances,
            args.draft_cost_fraction,
            args.max_batch_size,
        )
    except (TraceError, OSError) as exc:
        logger.error("--traffic-log %s: %s", args.traffic_log, exc)
        return 2
    windows = len(traffic.windows)
    logger.info(
        "traffic from %s: %d requests in %d %s-loop window%s, %d drafted (%s)",
        args.traffic_log, traffic.summary["requests"], windows, traffic.summary["loop"],
        "" if windows == 1 else "s", traffic.summary["drafted_requests"], path,
    )  # fmt: skip
    return _run(args, path, traffic.summary)


def _run(args: argparse.Namespace, path: Path, logged: dict[str, Any] | None) -> int:
    from controller.commands.simulate import read_scenario

    scenario = read_scenario(path)
    if scenario is None:
        return 2
    instances = args.instances or (scenario.fleet.instances if scenario.fleet else None)
    if instances is None or instances < 1:
        logger.error("--instances N (>= 1) is needed: %s has no fleet.instances", path)
        return 2
    try:
        plan = _plan(scenario, instances, args)
    except ValueError as exc:
        logger.error("plan for %s: %s", path, exc)
        return 2
    if logged is not None:
        plan["traffic"] = str(args.traffic_log)
        plan["traffic_log"] = logged | {"scenario": str(path) if args.out_dir else None}
    if args.out_dir is not None:
        _write(plan, args.out_dir)
    sys.stdout.write((json.dumps(plan, indent=1) if args.json else _summary(plan)) + "\n")
    return 0


def _plan(scenario: Any, instances: int, args: argparse.Namespace) -> dict[str, Any]:
    from sim.fleet_plan import search, task_homes
    from sim.objective import FIELDS
    from sim.plan_outputs import Servers, config_yaml, policy_yaml, sglang_commands, vllm_commands

    def progress(name: str) -> None:
        if not args.no_progress:
            logger.info("simulating %s", name)

    result = search(scenario, instances, args.search_scale, args.spill_margin, progress=progress)
    chosen = result.full[result.recommended]
    layout = chosen["layout"]
    spill_margin = layout.get("spill_margin")  # the recommended layout's (auto: its pick)
    servers = Servers(
        args.model, args.target, args.draft, args.host, args.base_port,
        scenario.block_size, scenario.max_batch_size,
    )  # fmt: skip
    return {
        "command": "draftctl plan " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 else []),
        "traffic": str(args.traffic),
        "instances": instances,
        "recommended": result.recommended,
        "layout": layout,
        "objective": result.objective,
        "gain_vs_best_uniform": result.gain_vs_best_uniform,
        "best_uniform": result.best_uniform,
        "full_length": {
            name: {
                "goodput_tok_s": e["goodput_tok_s"],
                "ttft_p99_s": e["ttft_p99_s"],
                "latency_ms_mean": e["latency_ms_mean"],
            }
            for name, e in result.full.items()
        },
        "spill_margin": spill_margin,
        "spill_margin_searched": args.spill_margin == "auto",
        "gateway_routing": (
            f"by task, spilling at {spill_margin} in-flight requests per server "
            "(policy.yaml spill_margin), as simulated"
            if spill_margin is not None
            else "by task only, as simulated"
        ),
        f"search_{FIELDS[result.objective]}": result.search,
        "search_scale": args.search_scale,
        "vllm_commands": vllm_commands(layout, servers),
        "sglang_commands": sglang_commands(layout, servers),
        "config_yaml": config_yaml(layout, servers),
        "policy_yaml": policy_yaml(layout, task_homes(layout), spill_margin),
    }


def _write(plan: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    (out_dir / "config.yaml").write_text(plan["config_yaml"])
    (out_dir / "policy.yaml").write_text(plan["policy_yaml"])
    for kind in ("vllm", "sglang"):
        script = "#!/usr/bin/env bash\n# Written by draftctl plan: one server per line.\n"
        script += "\n".join(line + " &" for line in plan[f"{kind}_commands"]) + "\nwait\n"
        (out_dir / f"launch-{kind}.sh").write_text(script)
    logger.info("wrote plan.json, config.yaml, policy.yaml and launch-*.sh to %s", out_dir)


def _summary(plan: dict[str, Any]) -> str:
    latency = plan["objective"] == "latency"
    measure = "1 / mean request latency" if latency else "goodput"
    lines = [
        f"recommended for {plan['instances']} instances: {plan['recommended']} "
        f"({plan['gain_vs_best_uniform']:.3f}x the best uniform fleet's {measure}, "
        f"{plan['best_uniform']}, at full length)",
    ]
    for name, pool in plan["layout"]["pools"].items():
        tasks = ", ".join(pool["tasks"]) or "every task"
        schedule = pool.get("num_speculative_tokens_per_batch_size", "-")
        lines.append(
            f"  pool {name}: {pool['instances']} instances, {tasks}; "
            f"num_speculative_tokens {pool['num_speculative_tokens']}; schedule {schedule}"
        )
    if latency:
        lines.append("search (shortened traffic, mean request latency ms):")
        ranked = sorted(plan["search_latency_ms_mean"].items(), key=lambda kv: kv[1] or math.inf)
    else:
        lines.append("search (shortened traffic, tokens/s):")
        ranked = sorted(plan["search_goodput_tok_s"].items(), key=lambda kv: -kv[1])
    lines += [f"  {name:<40} {value:8.0f}" for name, value in ranked]
    return "\n".join(lines)
