"""CPU an idle draftctl uses per second (timers, health checks, scrapes, policy-file polls).

Starts bench/gateway_overhead.py's fake upstream and ``draftctl serve`` in front of it (one
pool, default intervals: health every 2 s, scrape every 5 s, policy file polled 4x/s),
sends nothing, and reads the daemon's CPU time from /proc/PID/task/*/schedstat over
``--seconds``. ``--baseline PATH`` measures a second checkout side by side.

    .venv/bin/python bench/gateway_idle.py [--seconds 30] [--baseline /tmp/draftctl-OLD]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_overhead as bench


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--baseline", type=Path)
    args = parser.parse_args()
    port = bench._free_port()
    upstream = subprocess.Popen(
        [sys.executable, bench.__file__, "--upstream", str(port), "--interval-ms", "0"]
    )
    roots = {"draftctl": bench._ROOT}
    if args.baseline is not None:
        roots["baseline"] = args.baseline
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        url = f"http://127.0.0.1:{port}"
        bench._wait_http(url + "/health")
        with tempfile.TemporaryDirectory() as tmp:
            for name, root in roots.items():
                proc, gateway_url = bench._start_gateway(url, "0", Path(tmp) / name, root)
                procs[name] = proc
                bench._wait_http(gateway_url + "/readyz")
            time.sleep(3)
            before = {name: bench._schedstat(p.pid)[0] for name, p in procs.items()}
            time.sleep(args.seconds)
            after = {name: bench._schedstat(p.pid)[0] for name, p in procs.items()}
    finally:
        for proc in [*procs.values(), upstream]:
            proc.terminate()
            proc.wait(30)
    report = {
        "command": "bench/gateway_idle.py " + " ".join(sys.argv[1:]),
        "commit": bench._git_commit(),
        "baseline": None if args.baseline is None else str(args.baseline),
        "seconds": args.seconds,
        "idle_cpu_ms_per_s": {
            name: round((after[name] - before[name]) / args.seconds * 1e3, 3) for name in procs
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
