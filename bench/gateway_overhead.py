"""Latency and CPU that draftctl's gateway adds over calling a fast upstream directly.

Starts a fake OpenAI upstream (64 SSE chunks per streamed chat completion), ``draftctl
serve`` in front of it (one vLLM-kind pool, static policy, the built-in classifier artifact
when it exists, so every request is classified) and ``bench/reference_proxy.py``, a
do-nothing pass-through proxy, as a yardstick. Each proxy is pinned alone to one core, the
upstream and the load generator to the other (``taskset``). Two modes:

- ``saturated``: the upstream writes its chunks back to back and the load generator sends
  the next request as soon as one ends (closed loop). The slowest stage sets the pace, so
  this measures throughput and CPU per request; added latency here is mostly queueing.
- ``paced``: the upstream sleeps ``--interval-ms`` between chunks, like an LLM decoding,
  so 64 or 256 streams stay open without saturating either core. This is the latency a
  client sees through the gateway under that many concurrent streams.

Per point: added TTFB/total p50/p99 (proxied minus direct; ``direct_again_`` columns: the
direct path measured once more after the proxies, i.e. the noise floor of the round), the
proxy's CPU per request and CPU-bound req/s (``/proc/PID/stat``), its run-queue wait share
(``/proc/PID/schedstat``: time runnable but waiting for a CPU, i.e. other jobs on a shared
machine), and the CPU per request of the other core's processes (upstream + load
generator), which says which stage limits a closed loop. Prints one JSON line per point
and a JSON report at the end.

    .venv/bin/python bench/gateway_overhead.py [--mode both] [--requests 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
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
_PATH = "/v1/chat/completions"
# Column prefix per measured proxy.
_PREFIXES = {"draftctl": "", "reference": "reference_", "baseline": "baseline_"}


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


# -- the fast upstream ----------------------------------------------------------------------


def run_upstream(port: int, num_chunks: int, interval_s: float) -> None:
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
        # Paced: chunk i goes out at start + i * interval (a late wake-up does not push the
        # rest of the stream back, so the stream's length does not depend on the load).
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        for i in range(1, num_chunks):
            await resp.write(body_chunk)
            if interval_s:
                await asyncio.sleep(max(0.0, start_s + i * interval_s - loop.time()))
        await resp.write(_sse(last))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(_sse(usage))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post(_PATH, chat)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


# -- the load generator ---------------------------------------------------------------------


async def _one(
    session: aiohttp.ClientSession, url: str, payload: bytes, headers: dict[str, str]
) -> tuple[float, float]:
    start = time.perf_counter()
    async with session.post(url, data=payload, headers=headers) as r:
        assert r.status == 200, await r.text()
        first = None
        async for _ in r.content.iter_any():
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return first - start, end - start


async def _closed_loop(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    headers: dict[str, str],
    concurrency: int,
    num_requests: int,
    spread_s: float,
) -> list[tuple[float, float]]:
    remaining = [num_requests]
    results: list[tuple[float, float]] = []

    async def worker() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            results.append(await _one(session, url, payload, headers))

    async def staggered(i: int) -> None:
        await asyncio.sleep(i * spread_s)
        await worker()

    await asyncio.gather(*(staggered(i) for i in range(concurrency)))
    return results


_QUESTION = {"role": "user", "content": "Write a short poem about the sea."}


def history(num_chars: int) -> list[dict[str, str]]:
    """A multi-turn chat of about ``num_chars`` characters before the bench's question:
    alternating ~1,000-character user turns (code to review, some non-ASCII) and answers."""
    user = "Please review this function:\n" + "def f(x):\n    return x * 2  # doublé\n" * 25
    answer = "Sure. The function doubles its input; naming it double() would say so. " * 13
    turns: list[dict[str, str]] = []
    size = 0
    while size < num_chars:
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        size += len(user) + len(answer)
    return turns


async def load(
    url: str,
    concurrency: int,
    num_requests: int,
    num_warmup: int,
    hint: str | None,
    spread_s: float = 0.0,
    history_chars: int = 0,
) -> dict[str, Any]:
    messages = [*history(history_chars), _QUESTION]
    payload = json.dumps(
        {"model": MODEL, "stream": True, "max_tokens": 64, "messages": messages},
        ensure_ascii=False,
    ).encode()
    headers = {"content-type": "application/json"}
    if hint:
        headers["x-draftctl-task"] = hint
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm-up at the same concurrency: connections, caches, the gateway's windows.
        await _closed_loop(session, url, payload, headers, concurrency, num_warmup, spread_s)
        start = time.perf_counter()
        results = await _closed_loop(
            session, url, payload, headers, concurrency, num_requests, spread_s
        )
        elapsed = time.perf_counter() - start
    ttfb = sorted(r[0] for r in results)
    total = sorted(r[1] for r in results)
    return {"ttfb": ttfb, "total": total, "elapsed_s": elapsed, "num": len(results)}


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


# -- orchestration --------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    name: str  # "saturated" | "paced"
    interval_s: float  # upstream pause between chunks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one), summed over ``pid``'s threads.

    ``/proc/PID/task/TID/schedstat`` counts in nanoseconds, unlike ``/proc/PID/stat``'s
    10 ms clock ticks, which are too coarse for the slow paced runs.
    """
    cpu_ns = wait_ns = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            fields = stat.read_text().split()
        except OSError:  # a thread that just ended
            continue
        cpu_ns += int(fields[0])
        wait_ns += int(fields[1])
    return cpu_ns / 1e9, wait_ns / 1e9


def _steal_ticks() -> tuple[int, int]:
    """(steal, all) clock ticks of the whole machine from ``/proc/stat``: steal is time the
    hypervisor ran something else while a vCPU wanted to run, which no process's schedstat
    shows."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return fields[7], sum(fields)


def _own_cpu_s() -> float:
    return _schedstat(os.getpid())[0]


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


def _start_upstream(args: argparse.Namespace, mode: Mode) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [
        *_NICE,
        *["taskset", "-c", args.other_core, sys.executable, __file__],
        *["--upstream", str(port), "--chunks", str(args.chunks)],
        *["--interval-ms", str(mode.interval_s * 1e3)],
    ]
    return subprocess.Popen(cmd), f"http://127.0.0.1:{port}"


def _start_gateway(
    upstream_url: str, core: str, workdir: Path, root: Path = _ROOT
) -> tuple[subprocess.Popen[bytes], str]:
    """``draftctl serve`` from the tree at ``root`` (another checkout for --baseline)."""
    config = _start_gateway_config(upstream_url, workdir)
    port = str(_free_port())
    cmd = [
        *_NICE,
        *["taskset", "-c", core, sys.executable, "-m", "controller.cli"],
        *["--log-level", "warning", "serve", "--config", str(config), "--port", port],
    ]
    return subprocess.Popen(cmd, cwd=root), f"http://127.0.0.1:{port}"


def _start_gateway_config(upstream_url: str, workdir: Path, **pool: Any) -> Path:
    """The benchmark's draftctl config: one vLLM-kind pool (k = 7; ``pool`` adds settings)."""
    workdir.mkdir(exist_ok=True)
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
                        **pool,
                    }
                ],
            }
        )
    )
    return config


def _start_reference(upstream_url: str, core: str) -> tuple[subprocess.Popen[bytes], str]:
    port = str(_free_port())
    script = str(_ROOT / "bench" / "reference_proxy.py")
    cmd = [*_NICE, "taskset", "-c", core, sys.executable, script, upstream_url, port]
    return subprocess.Popen(cmd, cwd=_ROOT), f"http://127.0.0.1:{port}"


def _pcts(base: dict[str, Any], through: dict[str, Any], prefix: str) -> dict[str, float]:
    out = {}
    for metric in ("ttfb", "total"):
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            added = _pct(through[metric], q) - _pct(base[metric], q)
            out[f"{prefix}added_{metric}_{name}_ms"] = added * 1e3
    return out


def _sizes(args: argparse.Namespace, mode: Mode, concurrency: int) -> tuple[int, int, float]:
    """(requests, warm-up requests, seconds between the workers' starts) for one run.

    Paced requests all last about as long, so workers started together would stay in
    lockstep and hit the gateway in bursts of ``concurrency``; their starts are spread
    over one request's duration instead.
    """
    if mode.name == "saturated":
        return args.requests, max(200, concurrency), 0.0
    per_request_s = args.chunks * mode.interval_s
    num = max(args.paced_min_requests, round(args.paced_seconds / per_request_s * concurrency))
    return num, concurrency, per_request_s / concurrency


def _measured_load(
    args: argparse.Namespace,
    url: str,
    concurrency: int,
    sizes: tuple[int, int, float],
    pids: list[int],
) -> tuple[dict[str, Any], dict[str, float]]:
    """Run the load against ``url``; also CPU/wait deltas of ``pids`` over the measured part."""
    before = {pid: _schedstat(pid) for pid in pids}
    steal0 = _steal_ticks()
    own0, wall0 = _own_cpu_s(), time.perf_counter()
    result = uvloop.run(
        load(url, concurrency, sizes[0], sizes[1], args.hint, sizes[2], args.history_chars)
    )
    wall_s = time.perf_counter() - wall0
    num = result["num"] + sizes[1]  # warm-up requests used CPU too
    usage: dict[str, float] = {"loadgen_cpu_ms_per_request": (_own_cpu_s() - own0) / num * 1e3}
    steal1 = _steal_ticks()
    usage["steal_share"] = (steal1[0] - steal0[0]) / max(1, steal1[1] - steal0[1])
    for pid in pids:
        cpu1, wait1 = _schedstat(pid)
        usage[f"{pid}_cpu_s"] = cpu1 - before[pid][0]
        usage[f"{pid}_wait_share"] = (wait1 - before[pid][1]) / wall_s
        usage[f"{pid}_busy_share"] = usage[f"{pid}_cpu_s"] / wall_s
        usage[f"{pid}_cpu_ms_per_request"] = usage[f"{pid}_cpu_s"] / num * 1e3
    return result, usage


def _round(
    args: argparse.Namespace,
    mode: Mode,
    concurrency: int,
    targets: dict[str, tuple[str, int]],
) -> dict[str, float]:
    sizes = _sizes(args, mode, concurrency)
    up_pid = targets["direct"][1]
    direct, use = _measured_load(args, targets["direct"][0], concurrency, sizes, [up_pid])
    row: dict[str, float] = {
        "requests": sizes[0],
        "direct_ttfb_p50_ms": _pct(direct["ttfb"], 0.5) * 1e3,
        "direct_total_p50_ms": _pct(direct["total"], 0.5) * 1e3,
        "direct_total_p99_ms": _pct(direct["total"], 0.99) * 1e3,
        "direct_requests_per_s": direct["num"] / direct["elapsed_s"],
        # The other core's work per request: upstream plus load generator.
        "direct_other_core_cpu_ms_per_request": use[f"{up_pid}_cpu_ms_per_request"]
        + use["loadgen_cpu_ms_per_request"],
        "direct_upstream_runqueue_wait_share": use[f"{up_pid}_wait_share"],
        "direct_steal_share": use["steal_share"],
    }
    for name in [n for n in _PREFIXES if n in targets]:
        url, pid = targets[name]
        through, use = _measured_load(args, url, concurrency, sizes, [pid, up_pid])
        prefix = _PREFIXES[name]
        row.update(_pcts(direct, through, prefix))
        row[f"{prefix}cpu_ms_per_request"] = use[f"{pid}_cpu_ms_per_request"]
        row[f"{prefix}requests_per_s"] = through["num"] / through["elapsed_s"]
        # What one dedicated core would sustain at this CPU cost per request.
        row[f"{prefix}cpu_bound_requests_per_s"] = 1e3 / use[f"{pid}_cpu_ms_per_request"]
        # Share of the run the proxy's core was busy with it, and the share it was runnable
        # but waiting for a CPU (other jobs on a shared machine).
        row[f"{prefix}busy_share"] = use[f"{pid}_busy_share"]
        row[f"{prefix}runqueue_wait_share"] = use[f"{pid}_wait_share"]
        # Share of both vCPUs' time the hypervisor took away during this proxy's run.
        row[f"{prefix}steal_share"] = use["steal_share"]
        row[f"{prefix}other_core_cpu_ms_per_request"] = (
            use[f"{up_pid}_cpu_ms_per_request"] + use["loadgen_cpu_ms_per_request"]
        )
    # A/A: the direct path once more, after the proxies. Its "added" latency is the noise
    # floor of this round: what a zero-cost proxy would measure here.
    again, _ = _measured_load(args, targets["direct"][0], concurrency, sizes, [up_pid])
    row.update(_pcts(direct, again, "direct_again_"))
    return row


def _measure_mode(args: argparse.Namespace, mode: Mode, workdir: Path) -> list[dict[str, Any]]:
    upstream, direct = _start_upstream(args, mode)
    procs = [upstream]
    try:
        _wait_http(direct + "/health")
        gateway, gateway_url = _start_gateway(direct, args.gateway_core, workdir)
        procs.append(gateway)
        reference, reference_url = _start_reference(direct, args.gateway_core)
        procs.append(reference)
        _wait_http(gateway_url + "/healthz")
        _wait_http(reference_url + "/healthz")
        targets = {
            "direct": (direct + _PATH, upstream.pid),
            "draftctl": (gateway_url + _PATH, gateway.pid),
            "reference": (reference_url + _PATH, reference.pid),
        }
        if args.baseline is not None:
            baseline, baseline_url = _start_gateway(
                direct, args.gateway_core, workdir / "baseline", args.baseline
            )
            procs.append(baseline)
            _wait_http(baseline_url + "/healthz")
            targets["baseline"] = (baseline_url + _PATH, baseline.pid)
        rows = []
        for concurrency in args.concurrency:
            rounds = [_round(args, mode, concurrency, targets) for _ in range(args.rounds)]
            row = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
            rows.append({"mode": mode.name, "concurrency": concurrency, **row})
            print(json.dumps(rows[-1]), flush=True)
        return rows
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)


def _load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    versions = {p: metadata.version(p) for p in ("uvloop", "uvicorn", "httptools", "aiohttp")}
    return {"cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(), **versions}


def _classifier_state(hint: str | None) -> str:
    if hint:
        return f"skipped: every request carries x-draftctl-task: {hint}"
    from controller.classifier.artifact import builtin_artifact_dir

    if (builtin_artifact_dir() / "manifest.json").exists():
        return "built-in artifact: every request is classified"
    return "no artifact: every request takes the fallback task"


def _git_commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "controller", "engines", "policies", "bench"],
        cwd=_ROOT,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mode", choices=["saturated", "paced", "both"], default="both")
    parser.add_argument("--requests", type=int, default=2000, help="saturated: requests per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--chunks", type=int, default=64, help="SSE chunks per response")
    parser.add_argument(
        "--interval-ms", type=float, default=20.0, help="paced: upstream pause between chunks"
    )
    parser.add_argument(
        "--paced-seconds", type=float, default=15.0, help="paced: about this long per run"
    )
    parser.add_argument("--paced-min-requests", type=int, default=30)
    parser.add_argument(
        "--hint",
        choices=["math", "code", "chat"],
        help="send x-draftctl-task so the gateway skips the classifier",
    )
    parser.add_argument(
        "--history-chars",
        type=int,
        default=0,
        help="send this many characters of earlier chat turns before the question (a large "
        "request body, as multi-turn chat traffic has; default: the question alone)",
    )
    parser.add_argument("--gateway-core", default="0")
    parser.add_argument("--other-core", default="1")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run upstream, proxies and load generator at this nice level (e.g. -10 on a "
        "machine shared with other jobs, to approximate dedicated cores; needs root)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also measure draftctl from this other checkout (e.g. `git archive` of an "
        "earlier commit) in the same run; its columns are prefixed baseline_",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    return parser


def main() -> int:
    args = _parser().parse_args()
    if args.upstream:
        run_upstream(args.upstream, args.chunks, args.interval_ms / 1e3)
        return 0
    if args.nice:
        _NICE[:] = ["nice", "-n", str(args.nice)]
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    os.sched_setaffinity(0, {int(c) for c in args.other_core.split(",")})
    modes = {"saturated": Mode("saturated", 0.0), "paced": Mode("paced", args.interval_ms / 1e3)}
    chosen = list(modes.values()) if args.mode == "both" else [modes[args.mode]]
    load_before = _load_average()
    started = time.time()
    rows = []
    for mode in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            rows += _measure_mode(args, mode, Path(tmp))
    report = {
        "command": "bench/gateway_overhead.py " + " ".join(sys.argv[1:]),
        "commit": _git_commit(),
        "baseline": None if args.baseline is None else str(args.baseline),
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "machine": _machine(),
        "classifier": _classifier_state(args.hint),
        "nice": args.nice,
        "chunks_per_response": args.chunks,
        "history_chars": args.history_chars,
        "paced_interval_ms": args.interval_ms,
        "saturated_requests_per_run": args.requests,
        "rounds": args.rounds,
        "load_average_before": load_before,
        "load_average_after": _load_average(),
        "results": rows,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
