"""The daemon's start-up with the embedded engine, eager and compiled: time to ready, first
start and restart, and whether the compiled daemon answers what the eager one answers.

Per repeat, each variant in a random order: a fresh ``draftctl serve`` (the repository's
config.yaml, its embedded demo pair, every engine setting at its default but ``device`` and,
for ``compiled``, ``torch_compile: true, torch_compile_scope: layer``) with new, empty
compile and cost-table caches (a first start: it compiles, captures and profiles), three
greedy chat requests (math, code, chat) through the OpenAI API, a SIGTERM; then, unless
``--no-restart``, a second ``serve`` on the same caches (a restart: inductor's and Triton's
caches and the cost table are read back) and the same requests. Writes the JSON after every
start, so a call cut short keeps what it measured; each start keeps its ``stages``, the seconds
after the launch at which the daemon logged its engine imports, load, attention check, step
costs and listening socket (where a first start's time goes).

    python3 bench/daemon_start.py --device cuda --repeats 2 --out $OUT/daemon_start.json

Greedy decoding is lossless, so every variant should return the target's own greedy text;
eager and compiled forwards may still round differently at near-ties, so the file counts
the answers that differ instead of failing on them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.integration.processes import free_port, start, wait_ready  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "eager": {"torch_compile": False},
    "compiled": {"torch_compile": True, "torch_compile_scope": "layer"},
}
PROMPTS = {
    "math": "A train travels 60 km in 45 minutes. At that speed, how far does it go in 2 hours?",
    "code": "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "chat": "Suggest three names for a small bakery by the sea, with one sentence on each.",
}
# Lines of the daemon's log worth keeping beside the timings.
_LOG_LINES = re.compile(
    r"step costs|loaded on|loaded target|compile caches|from the environment|attention|capture"
    r"|classifier|listening|imported in|Traceback|Error"
)
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file (after every start)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--variants",
        default="eager,compiled",
        help=f"comma-separated, of {', '.join(VARIANTS)} (compiled needs cuda)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="first starts per variant")
    parser.add_argument(
        "--no-restart", action="store_true", help="skip the restart on each first start's caches"
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="per request")
    parser.add_argument("--order-seed", default="0", help="seed of the starts' random order")
    parser.add_argument("--ready-timeout-s", type=float, default=420.0)
    parser.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="skip a start that would not fit in what is left, at the longest so far (0: none)",
    )
    args = parser.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    if "compiled" in args.variants and args.device != "cuda":
        parser.error("the compiled variant needs --device cuda (torch_compile needs CUDA graphs)")
    if args.repeats < 1 or args.max_tokens < 1:
        parser.error("--repeats and --max-tokens must be at least 1")
    return args


def write_config(folder: Path, caches: Path, device: str, settings: dict[str, Any]) -> int:
    """The repository's config.yaml with its embedded backend pointed at ``caches``."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    port = free_port()
    config["server"].update(port=port, drain_grace_s=0)
    config["policy"] = {"path": str(ROOT / "policy.yaml"), "versions_dir": str(folder / "v")}
    backends = [b for b in config["backends"] if b["kind"] == "embedded"]
    for backend in backends:
        for key in ("target", "draft"):
            backend[key] = str(ROOT / backend[key])
        backend.update(
            device=device,
            compile_cache_dir=str(caches / "compile"),
            cost_cache_dir=str(caches / "costs"),
            **settings,
        )
    config["backends"] = backends
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return port


def ask(url: str, task: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": PROMPTS[task]}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-draftctl-task": task},
    )
    began = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as response:
        answer = json.loads(response.read())
        status = response.status
    return {
        "task": task,
        "status": status,
        "seconds": round(time.monotonic() - began, 3),
        "text": answer["choices"][0]["message"]["content"],
        "completion_tokens": answer.get("usage", {}).get("completion_tokens"),
    }


def one_start(caches: Path, args: argparse.Namespace, variant: str, kind: str) -> dict[str, Any]:
    """Start ``serve``, time it to ready, ask every prompt twice (cold, warm), stop it."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        port = write_config(folder, caches, args.device, VARIANTS[variant])
        config = str(folder / "config.yaml")
        argv = [sys.executable, "-m", "controller.cli", "serve", "--config", config]
        began = time.monotonic()
        began_wall = time.time()
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        daemon = start("draftctl", argv, folder, {"HF_HUB_OFFLINE": "1", "PYTHONPATH": path})
        url = f"http://127.0.0.1:{port}"
        try:
            ready_s = wait_ready([(daemon, url + "/readyz")], args.ready_timeout_s)
            rounds = [[ask(url, task, args.max_tokens) for task in PROMPTS] for _ in range(2)]
            stopped = time.monotonic()
        finally:
            daemon.stop(timeout_s=60)
        log = daemon.log_path.read_text(errors="replace").splitlines()
    return {
        "variant": variant,
        "kind": kind,
        "ready_s": round(ready_s, 2),
        "wall_s": round(stopped - began, 2),
        "exit_code": daemon.popen.returncode,
        "requests": rounds,
        "log": [line for line in log if _LOG_LINES.search(line)][-40:],
        # seconds from the launch to each kept line (where the start-up's time went)
        "stages": stages(log, began_wall),
    }


def stages(log: list[str], began_wall: float) -> list[list[Any]]:
    """[seconds after the launch, the line without its stamp] for each kept, stamped line of
    the daemon's log (its clock is this machine's: the same host)."""
    kept: list[list[Any]] = []
    for line in log:
        stamp = _STAMP.match(line)
        if stamp is None or not _LOG_LINES.search(line):
            continue
        at = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S"))
        offset = at + int(stamp.group(2)) / 1e3 - began_wall
        kept.append([round(offset, 2), line[stamp.end() :][:160]])
    return kept[-40:]


def differences(runs: list[dict[str, Any]]) -> dict[str, int]:
    """Per variant: answers (of every start) whose text differs from the first eager start's
    answer to the same prompt, or from that variant's own first answer without an eager run."""
    reference: dict[str, str] = {}
    for run in sorted(runs, key=lambda r: r["variant"] != "eager"):
        for request in run["requests"][0]:
            reference.setdefault(request["task"], request["text"])
    counts: dict[str, int] = {}
    for run in runs:
        for rounds in run["requests"]:
            differing = sum(r["text"] != reference[r["task"]] for r in rounds)
            counts[run["variant"]] = counts.get(run["variant"], 0) + differing
    return counts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    order = [(v, r) for v in args.variants for r in range(args.repeats)]
    random.Random(args.order_seed).shuffle(order)
    document: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": platform.node(),
        "device": args.device,
        # what the daemons inherit: a cache folder set here wins over compile_cache_dir
        "environment": {
            v: os.environ.get(v) for v in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
        },
        "order": [f"{v}#{r}" for v, r in order],
        "runs": [],
        "skipped": [],
    }
    began = time.monotonic()
    longest = 0.0
    for number, (variant, repeat) in enumerate(order, 1):
        left = args.budget_s - (time.monotonic() - began)
        if args.budget_s and longest and left < longest:
            document["skipped"].append(f"{variant}#{repeat}")
            print(f"[{number}/{len(order)}] {variant}#{repeat}: skipped ({left:.0f} s left)")
            continue
        with tempfile.TemporaryDirectory() as caches:
            pair_began = time.monotonic()
            kinds = ["first"] if args.no_restart else ["first", "restart"]
            for kind in kinds:
                run = one_start(Path(caches), args, variant, kind)
                run["repeat"] = repeat
                document["runs"].append(run)
                document["differences"] = differences(document["runs"])
                args.out.write_text(json.dumps(document, indent=1) + "\n")
                print(
                    f"[{number}/{len(order)}] {variant}#{repeat} {kind}: ready in "
                    f"{run['ready_s']:.1f} s, exit {run['exit_code']}",
                    flush=True,
                )
            longest = max(longest, time.monotonic() - pair_began)
    summary: dict[str, dict[str, float]] = {}
    for run in document["runs"]:
        times = summary.setdefault(f"{run['variant']} {run['kind']}", {})
        times.setdefault("min_s", run["ready_s"])
        times["min_s"] = min(times["min_s"], run["ready_s"])
        times["max_s"] = max(times.get("max_s", 0.0), run["ready_s"])
    document["ready_s"] = summary
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps({"ready_s": summary, "differences": document.get("differences")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
