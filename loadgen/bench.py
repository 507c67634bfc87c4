"""The benchmark's plan and loop: every target (policy or server) x data set x concurrency.

Targets run in order: the baseline first (a no-speculation policy put on the daemon, or a
separate server), then each policy file (put on through the admin API), or the endpoint as it
serves when no policy is given. Each cell is a closed-loop run of ``--requests`` requests.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from tqdm import tqdm

from loadgen import DEFAULT_DATASETS, PACKAGED_DATASETS
from loadgen.admin import PolicySwitch, policy_switch
from loadgen.prompts import Messages, load_prompts
from loadgen.runner import Load, closed_loop, warm_up
from loadgen.summary import add_speedups, run_row

BASELINE = "baseline"


class BenchError(RuntimeError):
    """The benchmark cannot run; the message says what to fix."""


@dataclass(frozen=True)
class Target:
    label: str
    url: str
    policy_text: str | None  # put on the daemon before its runs; None: as it serves


def targets(args: argparse.Namespace) -> list[Target]:
    out = []
    if args.baseline_url:
        out.append(Target(BASELINE, args.baseline_url.rstrip("/"), None))
    if args.baseline_policy:
        out.append(Target(BASELINE, args.url.rstrip("/"), _read(args.baseline_policy)))
    for path in args.policies or []:
        out.append(Target(Path(path).stem, args.url.rstrip("/"), _read(path)))
    if not args.policies:
        out.append(Target("served", args.url.rstrip("/"), None))
    labels = [t.label for t in out]
    if len(set(labels)) != len(labels):
        raise BenchError(f"policy files need distinct names (labels {labels})")
    return out


def _read(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchError(f"cannot read policy file {path}: {exc.strerror}") from exc


async def run_bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every cell's ``bench.json`` row, in run order (speedups filled in)."""
    datasets = args.datasets or (DEFAULT_DATASETS if args.data_dir else PACKAGED_DATASETS)
    names = [n.strip() for n in datasets.split(",") if n.strip()]
    prompts = {n: load_prompts(n, args.data_dir, args.requests) for n in names}
    plan = targets(args)
    num_cells = len(plan) * len(names) * len(args.concurrency)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = args.model or await _first_model(session, args.url.rstrip("/"))
        rows: list[dict[str, Any]] = []
        needs_admin = any(t.policy_text is not None for t in plan)
        backup = (args.out or Path(".")) / "original-policy.yaml"
        async with contextlib.AsyncExitStack() as stack:
            switch = None
            if needs_admin:
                switch = await stack.enter_async_context(
                    policy_switch(session, args.url.rstrip("/"), args.admin_token, backup)
                )
            bar = stack.enter_context(
                tqdm(
                    total=num_cells * args.requests,
                    unit="req",
                    file=sys.stderr,
                    disable=args.no_progress or not sys.stderr.isatty(),
                )
            )
            for target in plan:
                load = Load(target.url, model, args.max_tokens, args.timeout_s, args.extra_body)
                await _run_target(session, switch, target, load, prompts, args, rows, bar)
    add_speedups(rows, BASELINE if any(t.label == BASELINE for t in plan) else None)
    return rows


async def _run_target(
    session: aiohttp.ClientSession,
    switch: PolicySwitch | None,
    target: Target,
    load: Load,
    prompts: dict[str, list[Messages]],
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    bar: tqdm[Any],
) -> None:
    if target.policy_text is not None:
        assert switch is not None, "a policy target needs the admin switch"
        await switch.apply(target.policy_text, target.label)
    first = next(iter(prompts.values()))
    await warm_up(session, load, first)
    for dataset, items in prompts.items():
        for concurrency in args.concurrency:
            bar.set_description(f"{target.label} {dataset} c={concurrency}")
            run = await closed_loop(
                session, load, items, concurrency, args.requests, lambda _: bar.update(1)
            )
            rows.append(run_row(dataset, concurrency, target.label, run))


async def _first_model(session: aiohttp.ClientSession, url: str) -> str:
    try:
        async with session.get(f"{url}/v1/models") as r:
            data = await r.json() if r.status == 200 else {}
    except (aiohttp.ClientError, ValueError) as exc:
        raise BenchError(f"cannot reach {url}/v1/models ({exc}); check --url") from exc
    models = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
    if not models:
        raise BenchError(f"{url}/v1/models lists no model; pass --model")
    return str(models[0])
