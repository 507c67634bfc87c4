"""``draftctl policy ...``: policy tools. ``export-schedule`` writes vLLM k schedules.

The ``policy`` parser holds actions. To add one (e.g. admin actions), write a module
``controller/commands/<name>.py`` with ``register_action(sub)`` that adds its parser to ``sub``
and sets ``func``, and list ``<name>`` in ``ACTION_MODULES``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Extra action modules under controller.commands, each with register_action(sub).
ACTION_MODULES: tuple[str, ...] = ()


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("policy", help="policy tools (export-schedule, ...)")
    sub = parser.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    _register_export(sub)
    for name in ACTION_MODULES:
        importlib.import_module(f"controller.commands.{name}").register_action(sub)


def _register_export(sub: Any) -> None:
    export = sub.add_parser(
        "export-schedule",
        help="print a vLLM num_speculative_tokens_per_batch_size schedule per pool",
        description=(
            "For each pool (started with num_speculative_tokens = its k) choose, per batch "
            "size, the k <= pool k with the most expected tokens per second, from learned "
            "acceptance (--models, else the policy's priors) and the cost table."
        ),
    )
    export.add_argument(
        "--policy", type=Path, help="policy YAML (goodput section; default: defaults)"
    )
    export.add_argument("--config", type=Path, help="daemon config: take vLLM pools from it")
    export.add_argument(
        "--pool", action="append", default=[], metavar="NAME=K", help="a pool and its k (repeat)"
    )
    export.add_argument("--models", type=Path, help="OnlineModels snapshot JSON (learned rates)")
    export.add_argument("--cost-table", type=Path, help="cost table JSON (overrides the policy's)")
    export.add_argument(
        "--mix", default="math=1,code=1,chat=1", help="task shares, e.g. math=0.5,chat=0.5"
    )
    export.add_argument("--max-batch-size", type=int, default=256, help="vLLM max_num_seqs")
    export.add_argument("--block-size", type=int, default=16, help="draft block size")
    export.set_defaults(func=export_schedule)


def export_schedule(args: argparse.Namespace) -> int:
    from policies.validation import InvalidDocument

    try:
        result = _export(args)
    except InvalidDocument as exc:
        for problem in exc.problems:
            logger.error("%s: %s", args.policy or args.config, problem)
        return 2
    except (ValueError, OSError) as exc:
        logger.error("export-schedule: %s", exc)
        return 2
    sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


def _export(args: argparse.Namespace) -> dict[str, Any]:
    from policies.schedule import build_schedule

    policy, base_dir = _policy_spec(args.policy)
    goodput = policy.goodput
    pools = _pools(args)
    rates, rates_source = _rates(args.models, goodput, args.block_size)
    cost, cost_source = _cost(args, goodput, base_dir)
    mix = _mix(args.mix)
    out: dict[str, Any] = {
        "acceptance": rates_source,
        "cost": cost_source,
        "mix": {t.value: w for t, w in mix.items()},
        "pools": {},
    }
    for name, pool_k in pools.items():
        if pool_k == 0:
            out["pools"][name] = {"num_speculative_tokens": 0, "note": "k = 0: nothing to schedule"}
            continue
        ranges = build_schedule(
            rates, mix, cost, policy.min_spec_tokens, pool_k, args.max_batch_size
        )
        schedule = [r.as_list() for r in ranges]
        out["pools"][name] = {
            "num_speculative_tokens": pool_k,
            "num_speculative_tokens_per_batch_size": schedule,
            # Merge into the pool's --speculative-config JSON (vLLM 0.32 SpeculativeConfig).
            "speculative_config": json.dumps(
                {
                    "num_speculative_tokens": pool_k,
                    "num_speculative_tokens_per_batch_size": schedule,
                }
            ),
        }
    return out


def _policy_spec(path: Path | None) -> tuple[Any, Path]:
    from policies.model import PolicySpec, parse_policy

    if path is None:
        return PolicySpec(), Path(".")
    return parse_policy(path.read_text()), path.parent


def _pools(args: argparse.Namespace) -> dict[str, int]:
    pools: dict[str, int] = {}
    for item in args.pool:
        name, sep, k = item.partition("=")
        if not sep or not name or not k.isdigit():
            raise ValueError(f"--pool {item!r}: expected NAME=K with K a whole number")
        pools[name] = int(k)
    if args.config is not None:
        from controller.config import load_config

        for backend in load_config(args.config).backends:
            if getattr(backend, "kind", "") == "vllm":
                pools[backend.name] = int(getattr(backend, "spec_tokens", 0))
    if not pools:
        raise ValueError("no pools: pass --pool NAME=K (repeatable) or --config with vllm pools")
    return pools


def _rates(
    models: Path | None, goodput: Any, block_size: int
) -> tuple[dict[Any, list[float]], str]:
    from policies.types import TASKS, Task, max_spec_tokens

    n = max_spec_tokens(block_size)
    priors = {t: goodput.prior_for(t, n) for t in TASKS}
    if models is None:
        return priors, "policy priors (no --models snapshot)"
    data = json.loads(models.read_text())
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, dict):
        raise ValueError(f"--models {models}: expected an OnlineModels snapshot with 'tasks'")
    rates = dict(priors)
    for name, entry in tasks.items():
        learned = [float(x) for x in entry["accept_rates"]][:n]
        rates[Task(name)] = learned + priors[Task(name)][len(learned) :]
    return rates, f"learned ({models})"


def _cost(args: argparse.Namespace, goodput: Any, base_dir: Path) -> tuple[Any, str]:
    from engines.cost_tables import load_cost_table
    from policies.costmodel import CostModel, RelativeCost

    path = args.cost_table
    if path is None and goodput.cost_table:
        path = Path(goodput.cost_table)
        path = path if path.is_absolute() else base_dir / path
    if path is None:
        return RelativeCost(goodput.verify_width_multiple), "built-in relative estimate"
    model = CostModel(
        load_cost_table(path),
        block_size=args.block_size,
        verify_width_multiple=goodput.verify_width_multiple,
        draft_cost_fraction=goodput.draft_cost_fraction,
        prior_overhead_s=goodput.step_overhead_s,
        prior_overhead_per_request_s=goodput.request_overhead_s,
    )
    if args.models is not None:
        saved = json.loads(args.models.read_text())
        correction = saved.get("cost_correction")
        if correction:
            overheads = saved.get("cost_overhead_s") or ()
            model.load_corrections([float(c) for c in correction], [float(o) for o in overheads])
    return model.snapshot(), f"table {path}"


def _mix(text: str) -> dict[Any, float]:
    from policies.types import Task

    mix: dict[Any, float] = {}
    for item in text.split(","):
        name, sep, share = item.partition("=")
        try:
            mix[Task(name.strip())] = float(share)
        except ValueError:
            raise ValueError(
                f"--mix {item!r}: expected TASK=SHARE with TASK one of math, code, chat"
            ) from None
        if not sep:
            raise ValueError(f"--mix {item!r}: expected TASK=SHARE")
    return mix
