"""Latency and CPU that draftctl's gateway adds over calling a fast upstream directly.

Starts a fast fake OpenAI upstream (64 SSE chunks per streamed chat completion, no delay)
and `draftctl serve` in front of it, pins the gateway alone to one core and the upstream and
load generator to the other (``taskset``), then runs streaming requests at each concurrency
against the upstream directly and through the gateway. Prints a JSON report: added
TTFB/total p50/p99 (gateway minus direct), gateway CPU per request, and gateway req/s.

    .venv/bin/python bench/gateway_overhead.py [--requests 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
import yaml
from aiohttp import web

MODEL = "bench"
_ROOT = Path(__file__).resolve().parents[1]
_NICE: list[str] = []  # command prefix set by --nice
_CHUNK = {
    "id": "chatcmpl-bench",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": MODEL,
    "choices": [
        {"index": 0, "delta": {"content": "token "}, "logprobs": None, "finish_reason": None}
    ],
}


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


# -- the fast upstream ----------------------------------------------------------------------


def run_upstream(port: int, num_chunks: int) -> None:
    body_chunk = _sse(_CHUNK)
    last = dict(_CHUNK, choices=[dict(_CHUNK["choices"][0], finish_reason="length")])
    usage = {
        **{k: v for k, v in _CHUNK.items() if k != "choices"},
        "choices": [],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": num_chunks,
            "total_tokens": 5 + num_chunks,
        },
    }

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(num_chunks - 1):
            await resp.write(body_chunk)
        await resp.write(_sse(last))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(_sse(usage))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


# -- the load generator ---------------------------------------------------------------------


async def _one(session: aiohttp.ClientSession, url: str, payload: bytes) -> tuple[float, float]:
    start = time.perf_counter()
    async with session.post(url, data=payload, headers={"content-type": "application/json"}) as r:
        assert r.status == 200, await r.text()
        first = None
        async for _ in r.content.iter_any():
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return first - start, end - start


async def load(url: str, concurrency: int, num_requests: int) -> dict[str, Any]:
    payload = json.dumps(
        {
            "model": MODEL,
            "stream": True,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
        }
    ).encode()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(min(200, num_requests)):  # warm-up: connections, caches
            await _one(session, url, payload)
        queue = list(range(num_requests))
        results: list[tuple[float, float]] = []

        async def worker() -> None:
            while queue:
                queue.pop()
                results.append(await _one(session, url, payload))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    ttfb = sorted(r[0] for r in results)
    total = sorted(r[1] for r in results)
    return {"ttfb": ttfb, "total": total, "elapsed_s": elapsed, "num": len(results)}


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


# -- orchestration --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _runqueue_wait_s(pid: int) -> float:
    """Seconds ``pid`` spent runnable but not running (``/proc/PID/schedstat``)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def _wait_http(url: str, timeout_s: float = 30) -> None:
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def _start_gateway(
    upstream_url: str, core: str, workdir: Path
) -> tuple[subprocess.Popen[bytes], str]:
    config = workdir / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "server": {"port": 0},
                "policy": {
                    "path": str(workdir / "policy.yaml"),
                    "versions_dir": str(workdir / "v"),
                },
                "backends": [
                    {
                        "name": "k7",
                        "kind": "vllm",
                        "urls": [upstream_url],
                        "model": MODEL,
                        "spec_tokens": 7,
                        "block_size": 16,
                    }
                ],
            }
        )
    )
    port = str(_free_port())
    cmd = [
        *_NICE,
        "taskset",
        "-c",
        core,
        sys.executable,
        "-m",
        "controller.cli",
        "--log-level",
        "warning",
        "serve",
        "--config",
        str(config),
        "--port",
        port,
    ]
    return subprocess.Popen(cmd, cwd=_ROOT), f"http://127.0.0.1:{port}"


def _start_reference(upstream_url: str, core: str) -> tuple[subprocess.Popen[bytes], str]:
    port = str(_free_port())
    cmd = [
        *_NICE,
        "taskset",
        "-c",
        core,
        sys.executable,
        str(_ROOT / "bench" / "reference_proxy.py"),
        upstream_url,
        port,
    ]
    return subprocess.Popen(cmd, cwd=_ROOT), f"http://127.0.0.1:{port}"


def _pcts(base: dict[str, Any], through: dict[str, Any], prefix: str) -> dict[str, float]:
    out = {}
    for metric in ("ttfb", "total"):
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            added = _pct(through[metric], q) - _pct(base[metric], q)
            out[f"{prefix}added_{metric}_{name}_ms"] = added * 1e3
    return out


def _round(
    args: argparse.Namespace, concurrency: int, targets: dict[str, tuple[str, int]]
) -> dict[str, float]:
    direct = uvloop.run(load(targets["direct"][0], concurrency, args.requests))
    row: dict[str, float] = {
        "direct_total_p50_ms": _pct(direct["total"], 0.5) * 1e3,
        "direct_requests_per_s": direct["num"] / direct["elapsed_s"],
    }
    for name in ("draftctl", "reference"):
        url, pid = targets[name]
        cpu0, wait0, wall0 = _cpu_s(pid), _runqueue_wait_s(pid), time.perf_counter()
        through = uvloop.run(load(url, concurrency, args.requests))
        num = through["num"] + min(200, args.requests)  # warm-up requests used CPU too
        cpu_s = _cpu_s(pid) - cpu0
        prefix = "" if name == "draftctl" else "reference_"
        row.update(_pcts(direct, through, prefix))
        row[f"{prefix}cpu_ms_per_request"] = cpu_s / num * 1e3
        row[f"{prefix}requests_per_s"] = through["num"] / through["elapsed_s"]
        # What one dedicated core would sustain at this CPU cost per request.
        row[f"{prefix}cpu_bound_requests_per_s"] = num / cpu_s
        # Share of the run the proxy was runnable but waiting for a CPU (other jobs).
        wall_s = time.perf_counter() - wall0
        row[f"{prefix}runqueue_wait_share"] = (_runqueue_wait_s(pid) - wait0) / wall_s
    return row


def _measure(args: argparse.Namespace, targets: dict[str, tuple[str, int]]) -> list[dict[str, Any]]:
    rows = []
    for concurrency in args.concurrency:
        rounds = [_round(args, concurrency, targets) for _ in range(args.rounds)]
        row = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
        rows.append({"concurrency": concurrency, **row})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--chunks", type=int, default=64, help="SSE chunks per response")
    parser.add_argument("--gateway-core", default="0")
    parser.add_argument("--other-core", default="1")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run upstream, proxies and load generator at this nice level (e.g. -10 on a "
        "machine shared with other jobs, to approximate dedicated cores; needs root)",
    )
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.nice:
        _NICE[:] = ["nice", "-n", str(args.nice)]
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    if args.upstream:
        run_upstream(args.upstream, args.chunks)
        return 0
    os.sched_setaffinity(0, {int(c) for c in args.other_core.split(",")})
    port = _free_port()
    upstream = subprocess.Popen(
        [
            *_NICE,
            "taskset",
            "-c",
            args.other_core,
            sys.executable,
            __file__,
            "--upstream",
            str(port),
            "--chunks",
            str(args.chunks),
        ]
    )
    direct = f"http://127.0.0.1:{port}"
    procs = [upstream]
    load_before = _load_average()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            _wait_http(direct + "/health")
            gateway, gateway_url = _start_gateway(direct, args.gateway_core, Path(tmp))
            procs.append(gateway)
            reference, reference_url = _start_reference(direct, args.gateway_core)
            procs.append(reference)
            _wait_http(gateway_url + "/healthz")
            _wait_http(reference_url + "/healthz")
            path = "/v1/chat/completions"
            targets = {
                "direct": (direct + path, upstream.pid),
                "draftctl": (gateway_url + path, gateway.pid),
                "reference": (reference_url + path, reference.pid),
            }
            rows = _measure(args, targets)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    report = {
        "nice": args.nice,
        "chunks_per_response": args.chunks,
        "requests_per_run": args.requests,
        "rounds": args.rounds,
        "load_average_before": load_before,
        "load_average_after": _load_average(),
        "results": rows,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
