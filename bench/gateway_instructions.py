"""Instructions per streamed request in draftctl and in the reference proxy (callgrind).

CPU time per request on a shared 2-core VM moves by ±15 % between runs; instruction counts
do not. This runs each proxy under ``valgrind --tool=callgrind`` (instrumentation off while it
starts), in front of bench/gateway_overhead.py's fast upstream, sends warm-up requests,
switches instrumentation on, sends ``--requests`` streamed chat completions at ``--concurrency``
and reads the instruction total back. Idle work during the measured stretch (timers,
health checks) is included, as it is in the CPU figures of gateway_overhead.py.

    .venv/bin/python bench/gateway_instructions.py [--requests 300] [--concurrency 1 16]

Under valgrind a process runs ~50x slower, so reads batch differently than at full speed
(more chunks per upstream read at high concurrency): compare the two proxies with each
other at the same concurrency, not with unprofiled runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_overhead as bench

_ROOT = Path(__file__).resolve().parents[1]
_VALGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]


def _callgrind(cmd: list[str], out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*_VALGRIND, f"--callgrind-out-file={out}", *cmd],
        cwd=_ROOT,
        stderr=subprocess.DEVNULL,
    )


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _total_instructions(out: Path) -> int:
    """Sum of the ``totals:`` lines of every dump part written to ``out`` (and ``out.N``)."""
    total = 0
    for part in out.parent.glob(out.name + "*"):
        for line in part.read_text().splitlines():
            if line.startswith("totals:"):
                total += int(line.split()[1])
                break
    return total


def _measure(
    name: str, cmd: list[str], url: str, ready_url: str, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    out = workdir / f"{name}.callgrind"
    proc = _callgrind(cmd, out)
    try:
        bench._wait_http(ready_url, timeout_s=300)
        rows: dict[str, Any] = {}
        for concurrency in args.concurrency:
            warmup = max(20, concurrency)
            uvloop.run(bench.load(url, concurrency, warmup, 0, args.hint))
            for part in workdir.glob(out.name + "*"):
                part.unlink()
            _control(proc.pid, "-z")
            _control(proc.pid, "-i", "on")
            uvloop.run(bench.load(url, concurrency, args.requests, 0, args.hint))
            _control(proc.pid, "-i", "off")
            _control(proc.pid, "-d")
            time.sleep(1)
            instructions = _total_instructions(out)
            rows[str(concurrency)] = round(instructions / args.requests)
            print(
                json.dumps(
                    {
                        "proxy": name,
                        "concurrency": concurrency,
                        "per_request": rows[str(concurrency)],
                    }
                ),
                flush=True,
            )
        return rows
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--hint", choices=["math", "code", "chat"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    upstream_port = bench._free_port()
    upstream = subprocess.Popen(
        [
            *[sys.executable, bench.__file__, "--upstream", str(upstream_port)],
            *["--chunks", str(args.chunks), "--interval-ms", "0"],
        ]
    )
    direct = f"http://127.0.0.1:{upstream_port}"
    report: dict[str, Any] = {
        "command": "bench/gateway_instructions.py " + " ".join(sys.argv[1:]),
        "commit": bench._git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "classifier": bench._classifier_state(args.hint),
        "requests": args.requests,
    }
    try:
        bench._wait_http(direct + "/health")
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            config = workdir / "gw"
            config.mkdir()
            gw_port = bench._free_port()
            # Health checks every 30 s (5 s timeout): under valgrind a 2 s check can time out.
            bench._start_gateway_config(direct, config, health_interval_s=30)
            gateway_cmd = [sys.executable, "-m", "controller.cli", "--log-level", "warning"]
            gateway_cmd += ["serve", "--config", str(config / "config.yaml"), "--port"]
            gateway_cmd += [str(gw_port)]
            base = f"http://127.0.0.1:{gw_port}"
            # /readyz: the pool's first health check may time out while valgrind starts up.
            report["draftctl"] = _measure(
                "draftctl", gateway_cmd, base + bench._PATH, base + "/readyz", args, workdir
            )
            ref_port = bench._free_port()
            ref_cmd = [sys.executable, str(_ROOT / "bench" / "reference_proxy.py"), direct]
            ref_cmd += [str(ref_port)]
            base = f"http://127.0.0.1:{ref_port}"
            report["reference"] = _measure(
                "reference", ref_cmd, base + bench._PATH, base + "/healthz", args, workdir
            )
    finally:
        upstream.terminate()
        upstream.wait(30)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
