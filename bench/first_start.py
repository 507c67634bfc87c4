"""First starts and restarts of a compiled engine, repeated, for one or more code trees.

    python3 bench/first_start.py --repeats 3 --out $OUT/first_start.json   # H200, 8B shape
    python3 bench/first_start.py --tree new=. --tree old=/tmp/old --repeats 2 --out ...  # A/B
    python bench/first_start.py --device cpu --tiny --repeats 2 --out /tmp/f.json  # CPU smoke

Each start is a fresh process of ``bench/ragged_gpu_check.py --budget-s 0`` (build the runner:
compile, capture the padded and the ragged graphs, nothing else) from the given tree. A
*first start* gets a new, empty compile cache folder (``TORCHINDUCTOR_CACHE_DIR`` and
``TRITON_CACHE_DIR`` in it, as the embedded backend's ``compile_cache_dir`` sets them); with
``--restart`` a second process then starts on that same folder (a restart). The (tree,
repeat) runs go in a random order (``--order-seed``), so a machine that drifts during the call
does not land on one tree; two trees of the same code (``--tree a=. --tree b=.``) give the A/A
spread. Session 18 saw first starts of the same code 62 and 76 s apart on one machine: one
start is not a measurement.

Per start the JSON keeps the process's wall seconds and the runner's own ``capture_s`` and
``capture_parts_s`` (README's start-up figures are padded + ragged capture), the graphs
compiled (``dynamo.stats.unique_graphs``) and inductor's FX-graph cache hits and misses; per
tree mean, sd, min and max of each. Writes the JSON after every start; a start that fails or
times out is recorded (``failed``, ``errors``) and the others still run (exit status 1).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHECK = Path("bench") / "ragged_gpu_check.py"


def parse_tree(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--tree {text!r}: use NAME=PATH (e.g. new=.)")
    folder = Path(path).resolve()
    if not (folder / CHECK).is_file():
        raise argparse.ArgumentTypeError(f"--tree {text!r}: {folder / CHECK} does not exist")
    return name, folder


def start(tree: Path, cache: Path, check_args: list[str], timeout_s: float) -> dict[str, Any]:
    """One process of the check from ``tree`` on the compile cache folder ``cache``."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "start.json"
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TRITON_CACHE_DIR": str(cache / "triton"),
            # the tree first; an empty entry would add the working folder
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        command = [sys.executable, str(tree / CHECK), *check_args, "--budget-s", "0"]
        started = time.perf_counter()
        done = subprocess.run(
            [*command, "--out", str(out)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        wall_s = time.perf_counter() - started
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr or done.stdout)[-2000:]
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{tail}")
        setup = json.loads(out.read_text())["setup"]
    dynamo = setup.get("dynamo", {})
    inductor = dynamo.get("inductor", {})
    capture = setup["capture_s"]
    return {
        "wall_s": round(wall_s, 2),
        "start_s": round(capture["padded"] + capture["ragged"], 2),
        "capture_s": capture,
        "capture_parts_s": setup["capture_parts_s"],
        "capture_stages_s": setup.get("capture_stages_s", {}),
        "graphs_compiled": dynamo.get("stats", {}).get("unique_graphs", 0),
        # where the start's seconds went: torch.compile's own timers, and the engine's Triton
        # kernels compiled at their first launch per specialisation (CUDA only)
        "compile_time_s": setup.get("compile_time_s", {}),
        "triton_jit": setup.get("triton_jit", {}),
        "fxgraph_cache_hit": inductor.get("fxgraph_cache_hit", 0),
        "fxgraph_cache_miss": inductor.get("fxgraph_cache_miss", 0),
        "num_graphs": setup["num_graphs"],
        "attention_compiled_ahead": setup.get("attention_compiled_ahead", 0),
        "graph_warmups": setup.get("graph_warmups", 2),
        "device": setup["device"],
        "torch": setup["torch"],
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 2),
        "sd": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0,
        "min": round(min(values), 2),
        "max": round(max(values), 2),
        "n": len(values),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tree and kind (first, restart): start_s and wall_s spread, graphs compiled."""
    summary: dict[str, Any] = {}
    for run in runs:
        entry = summary.setdefault(run["tree"], {}).setdefault(run["kind"], [])
        entry.append(run)
    return {
        tree: {
            kind: {
                "start_s": spread([r["start_s"] for r in items]),
                "wall_s": spread([r["wall_s"] for r in items]),
                "graphs_compiled": sorted({r["graphs_compiled"] for r in items}),
            }
            for kind, items in kinds.items()
        }
        for tree, kinds in summary.items()
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Arguments after -- go to ragged_gpu_check.py as they are.",
    )
    parser.add_argument("--out", required=True, help="JSON file to write (after every start)")
    parser.add_argument(
        "--tree",
        action="append",
        type=parse_tree,
        help="NAME=PATH of a code tree to start (repeatable; default: this checkout as 'this')",
    )
    parser.add_argument(
        "--args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="extra ragged_gpu_check.py arguments for tree NAME (repeatable), e.g. "
        '--tree new=. --tree old=. --args "old=--graph-warmups 2 --no-compile-ahead": an A/B '
        "of one tree",
    )
    parser.add_argument("--repeats", type=int, default=2, help="first starts per tree")
    parser.add_argument(
        "--restart", action="store_true", help="after each first start, a restart on its cache"
    )
    parser.add_argument("--order-seed", default="0", help="seed of the runs' random order")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="default cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny random shape (CPU smoke)")
    parser.add_argument("--batches", default="8,64", help="batch sizes (the largest is captured)")
    parser.add_argument(
        "--attention", default="triton", choices=["sdpa", "triton"], help="default triton"
    )
    parser.add_argument(
        "--compile-scope",
        default="layer",
        choices=["forward", "layer"],
        help="default layer (regional compilation, the engine's setting)",
    )
    parser.add_argument(
        "--no-compile", action="store_true", help="capture without torch.compile (CPU smoke)"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=420.0, help="give up on one start after this"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="finish by this: a (tree, repeat) whose first start (and restart) would not fit in "
        "what is left, at the longest so far, is skipped (session 19 lost a start to a call's "
        "limit when this only bounded when a start began)",
    )
    args, extra = parser.parse_known_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: use 1 or more")
    args.extra = [a for a in extra if a != "--"]
    args.tree = args.tree or [("this", ROOT)]
    names = [name for name, _ in args.tree]
    if len(set(names)) != len(names):
        parser.error(f"--tree names must differ: {names}")
    args.tree_args = {}
    for text in args.args:
        name, sep, extra_args = text.partition("=")
        if not sep or name not in names:
            parser.error(f"--args {text!r}: use NAME=ARGS with NAME one of the trees {names}")
        args.tree_args[name] = args.tree_args.get(name, []) + shlex.split(extra_args)
    return args


def check_arguments(args: argparse.Namespace) -> list[str]:
    out = ["--device", args.device, "--batches", args.batches, "--attention", args.attention]
    if not args.no_compile:
        out += ["--compile", "--compile-scope", args.compile_scope]
    if args.tiny:
        out.append("--tiny")
    return out + args.extra


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = [(name, tree, repeat) for name, tree in args.tree for repeat in range(args.repeats)]
    random.Random(args.order_seed).shuffle(plan)
    check_args = check_arguments(args)
    result: dict[str, Any] = {
        "command": " ".join(
            ["bench/first_start.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "trees": {name: str(tree) for name, tree in args.tree},
        "check_arguments": check_args,
        "tree_arguments": args.tree_args,
        "order": [f"{name}#{repeat}" for name, _, repeat in plan],
        "runs": [],
        "skipped": [],
        "failed": [],
        "errors": [],
    }
    started = time.perf_counter()
    out = Path(args.out)
    longest = 0.0  # wall seconds of the longest (tree, repeat) so far: a first start + restart
    for index, (name, tree, repeat) in enumerate(plan, 1):
        if time.perf_counter() - started + longest > args.budget_s:
            result["skipped"].append(f"{name}#{repeat}")
            continue
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="draftctl-compile-cache-") as cache:
            kinds = ["first", "restart"] if args.restart else ["first"]
            for kind in kinds:
                try:
                    tree_args = check_args + args.tree_args.get(name, [])
                    run = start(tree, Path(cache), tree_args, args.timeout_s)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"{name}#{repeat} {kind} failed: {exc}", file=sys.stderr, flush=True)
                    result["failed"].append({"run": f"{name}#{repeat}", "kind": kind})
                    result["errors"].append(str(exc)[-2000:])
                    break  # no restart of a first start that failed
                result["runs"].append({"tree": name, "repeat": repeat, "kind": kind, **run})
                print(
                    f"[{index}/{len(plan)} {time.perf_counter() - started:6.0f}s] {name}#{repeat}"
                    f" {kind}: {run['start_s']:.1f} s capture ({run['wall_s']:.1f} s process),"
                    f" {run['graphs_compiled']} graphs compiled",
                    file=sys.stderr,
                    flush=True,
                )
        longest = max(longest, time.perf_counter() - began)
        result["summary"] = summarise(result["runs"])
        out.write_text(json.dumps(result, indent=1) + "\n")
    result["summary"] = summarise(result["runs"])
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
