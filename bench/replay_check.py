"""Issue #18's target: the what-if of the running policy on its own recorded traffic reproduces
the recorded throughput (within 10%).

Per repeat: a fresh ``draftctl serve`` (repository config.yaml and policy.yaml, embedded demo
pair on CPU, recording on), driven by ``draftctl bench`` (closed loop, several data sets and
concurrencies), then ``draftctl simulate --replay`` of its trace with the running policy as
both the what-if and the recorded policy. Writes every repeat's bench rows and replay report.

    .venv/bin/python bench/replay_check.py --out bench/results/replay_check_cpu_2026-12-01.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.processes import free_port, start, wait_ready

ROOT = Path(__file__).resolve().parents[1]


def record(folder: Path, args: argparse.Namespace) -> Path:
    """Serve the embedded demo pair with recording on, drive it with ``draftctl bench``
    (``args``: data_dir, datasets, concurrency, requests, max_tokens), stop it; returns the
    served trace (``folder/served.jsonl``; bench's rows in ``folder/bench``)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    port = free_port()
    config["server"].update(port=port, drain_grace_s=0)
    config["policy"] = {"path": str(ROOT / "policy.yaml"), "versions_dir": str(folder / "v")}
    config["recording"] = {"enabled": True, "path": str(folder / "served.jsonl")}
    for backend in config["backends"]:
        for key in ("target", "draft"):
            backend[key] = str(ROOT / backend[key])
        backend.update(device="cpu", cost_cache_dir=str(folder / "costs"))  # profiled afresh
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    argv = [
        sys.executable,
        "-m",
        "controller.cli",
        "serve",
        "--config",
        str(folder / "config.yaml"),
    ]
    daemon = start("draftctl", argv, folder, {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready([(daemon, url + "/readyz")], 300)
        bench = [
            sys.executable, "-m", "controller.cli", "bench", "--url", url, "--datasets",
            args.datasets, "--data-dir", str(args.data_dir), "--concurrency", args.concurrency,
            "--requests", str(args.requests), "--max-tokens", str(args.max_tokens),
            "--out", str(folder / "bench"), "--no-progress",
        ]  # fmt: skip
        subprocess.run(bench, check=True, cwd=ROOT, capture_output=True)
    finally:
        daemon.stop()
    return folder / "served.jsonl"


def repeat(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    record(folder, args)
    replay = [
        sys.executable, "-m", "controller.cli", "simulate", "--replay",
        str(folder / "served.jsonl"), "--policy", str(ROOT / "policy.yaml"),
        "--recorded-policy", str(ROOT / "policy.yaml"), "--json",
    ]  # fmt: skip
    report = json.loads(subprocess.run(replay, check=True, cwd=ROOT, capture_output=True).stdout)
    uncalibrated = json.loads(
        subprocess.run(
            [*replay, "--no-calibrate"], check=True, cwd=ROOT, capture_output=True
        ).stdout
    )
    bench_rows = json.loads((folder / "bench" / "bench.json").read_text())["runs"]
    print(f"reproduction error {100 * report['reproduction_error']:+.1f}%", flush=True)
    return {
        "bench": bench_rows,
        "replay": report,
        "uncalibrated_reproduction_error": uncalibrated["reproduction_error"],
    }


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    """``record``'s settings: the prompts and the bench's load."""
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--datasets", default="gsm8k,humaneval,mt-bench")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_record_arguments(parser)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    repeats = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            repeats.append(repeat(Path(folder), args))
    errors = [r["replay"]["reproduction_error"] for r in repeats]
    document = {
        "command": " ".join(sys.argv),
        "machine": "2 shared CPU cores (other jobs running), embedded demo pair, device cpu",
        "settings": {k: str(v) for k, v in vars(args).items()},
        "reproduction_error": {
            "mean": statistics.fmean(errors),
            "spread": max(errors) - min(errors),
            "runs": errors,
        },
        "repeats": repeats,
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
