"""``draftctl plan``: a pool layout and per-pool k schedules for a fleet, from its traffic."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
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
            "and the best uniform fleet at full length and recommends the best there (a "
            "pooled layout must beat the best uniform fleet by 0.5%), with its gain, and "
            "writes the vLLM/SGLang launch commands and the matching draftctl config and "
            "policy files."
        ),
    )
    parser.add_argument(
        "--traffic", required=True, type=Path, help="scenario YAML describing the traffic"
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
    from controller.commands.simulate import read_scenario

    scenario = read_scenario(args.traffic)
    if scenario is None:
        return 2
    instances = args.instances or (scenario.fleet.instances if scenario.fleet else None)
    if instances is None or instances < 1:
        logger.error("--instances N (>= 1) is needed: %s has no fleet.instances", args.traffic)
        return 2
    if not 0 < args.search_scale <= 1:
        logger.error("--search-scale must be in (0, 1], got %s", args.search_scale)
        return 2
    try:
        plan = _plan(scenario, instances, args)
    except ValueError as exc:
        logger.error("plan for %s: %s", args.traffic, exc)
        return 2
    if args.out_dir is not None:
        _write(plan, args.out_dir)
    sys.stdout.write((json.dumps(plan, indent=1) if args.json else _summary(plan)) + "\n")
    return 0


def _plan(scenario: Any, instances: int, args: argparse.Namespace) -> dict[str, Any]:
    from sim.fleet_plan import search, task_homes
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
        "gain_vs_best_uniform": result.gain_vs_best_uniform,
        "best_uniform": result.best_uniform,
        "full_length": {
            name: {"goodput_tok_s": e["goodput_tok_s"], "ttft_p99_s": e["ttft_p99_s"]}
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
        "search_goodput_tok_s": result.search,
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
    lines = [
        f"recommended for {plan['instances']} instances: {plan['recommended']} "
        f"({plan['gain_vs_best_uniform']:.3f}x the best uniform fleet, {plan['best_uniform']}, "
        "at full length)",
    ]
    for name, pool in plan["layout"]["pools"].items():
        tasks = ", ".join(pool["tasks"]) or "every task"
        schedule = pool.get("num_speculative_tokens_per_batch_size", "-")
        lines.append(
            f"  pool {name}: {pool['instances']} instances, {tasks}; "
            f"num_speculative_tokens {pool['num_speculative_tokens']}; schedule {schedule}"
        )
    lines.append("search (shortened traffic, tokens/s):")
    ranked = sorted(plan["search_goodput_tok_s"].items(), key=lambda kv: -kv[1])
    lines += [f"  {name:<40} {value:8.0f}" for name, value in ranked]
    return "\n".join(lines)
