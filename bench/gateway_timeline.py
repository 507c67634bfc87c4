"""Where a cold single-stream request spends its time-to-first-byte through draftctl.

The paced one-stream case of ``bench/gateway_overhead.py`` adds more than the gateway's
CPU per request would suggest: between chunks every process sleeps, and on this VM a
vCPU that went idle loses its caches, so the next request runs cold. This script splits
one request's time-to-first-byte into stages, from timestamps on one clock
(``time.perf_counter`` is CLOCK_MONOTONIC, shared by all processes):

    net_in      client sends              -> gateway's uvicorn protocol gets the bytes
    uvicorn     bytes in                  -> ASGI call of the gateway
    parse       ASGI call                 -> planner starts (body read, JSON, checks)
    classify    the planner's classify()  (classifier + threshold)
    plan        planner start             -> plan ready (classify, policy, routing)
    to_write    plan ready                -> upstream request written (pool, body bytes)
    write       the upstream socket write
    upstream    written                   -> upstream response headers in (2 wake-ups)
    first_body  headers in                -> first body bytes in
    to_respond  first body bytes          -> gateway._respond (stream set-up)
    respond     _respond                  -> RelayResponse starts
    start       response start sent to the client (uvicorn builds headers, one write)
    chunk       first chunk out of the relay iterator (SSE annotator)
    send        first body chunk sent to the client
    net_out     sent                      -> client has the first body bytes
    ttfb        client sends              -> client has the first body bytes

The gateway runs *in this process* with those functions wrapped (timing only; a bench
tool, not the product), pinned to ``--gateway-core``; the upstream (``gateway_overhead.py
--upstream``) and a sequential client share ``--other-core``, as in gateway_overhead.py.
Stages that do not apply (``classify`` with ``--hint``) read 0. The same client first
sends as many requests straight to the upstream, for the direct time-to-first-byte.

    .venv/bin/python bench/gateway_timeline.py [--requests 60] [--interval-ms 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "bench")]

import gateway_overhead as overhead  # noqa: E402

STAGES = (
    ("net_in", "client_send", "data"),
    ("uvicorn", "data", "asgi"),
    ("parse", "asgi", "plan0"),
    ("classify", "classify0", "classify1"),
    ("plan", "plan0", "plan1"),
    ("to_write", "plan1", "write0"),
    ("write", "write0", "write1"),
    ("upstream", "write1", "headers"),
    ("first_body", "headers", "body"),
    ("to_respond", "body", "respond"),
    ("respond", "respond", "relay"),
    ("start", "relay", "start1"),
    ("chunk", "start1", "chunk"),
    ("send", "chunk", "sent"),
    ("net_out", "sent", "client_first"),
    ("ttfb", "client_send", "client_first"),
)


class Marks:
    """First time each mark is reached, per request (one request at a time)."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.done: list[dict[str, float]] = []

    def mark(self, name: str) -> None:
        self.current.setdefault(name, time.perf_counter())

    def new_request(self) -> None:
        self.current = {"data": time.perf_counter()}

    def end_request(self) -> None:
        self.done.append(self.current)


def _wrap_sync(owner: Any, name: str, before: Callable[[], None], after: Callable[[], None]):
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        before()
        try:
            return original(*args, **kwargs)
        finally:
            after()

    setattr(owner, name, wrapped)


def instrument(marks: Marks) -> None:
    """Wrap the request path's stages; timing only, behaviour unchanged."""
    import uvicorn.protocols.http.httptools_impl as uvicorn_http

    from controller import app, gateway, planner, relay_response
    from engines import http_connection

    def nothing() -> None:
        pass

    original_data = uvicorn_http.HttpToolsProtocol.data_received

    def data_received(self: Any, data: bytes) -> None:
        if data.startswith(b"POST"):
            marks.new_request()
        original_data(self, data)

    uvicorn_http.HttpToolsProtocol.data_received = data_received  # type: ignore[method-assign]
    m = marks.mark
    _wrap_sync(planner.Planner, "plan", lambda: m("plan0"), lambda: m("plan1"))
    _wrap_sync(planner.Planner, "classify", lambda: m("classify0"), lambda: m("classify1"))
    _wrap_sync(http_connection.Connection, "start", lambda: m("write0"), lambda: m("write1"))
    _wrap_sync(http_connection.Connection, "on_headers_complete", lambda: m("headers"), nothing)
    _wrap_sync(http_connection.Connection, "on_body", lambda: m("body"), nothing)

    original_call = app.HotPath.__call__

    async def hot_path(self: Any, scope: Any, receive: Any, send: Any) -> None:
        m("asgi")
        await original_call(self, scope, receive, send)

    app.HotPath.__call__ = hot_path  # type: ignore[method-assign]
    original_respond = gateway.Gateway._respond

    async def respond(self: Any, *args: Any) -> Any:
        m("respond")
        return await original_respond(self, *args)

    gateway.Gateway._respond = respond  # type: ignore[method-assign]
    original_relay = relay_response.RelayResponse.__call__

    async def relay(self: Any, scope: Any, receive: Any, send: Any) -> None:
        m("relay")
        body = self.body_iterator

        async def chunks() -> Any:
            async for chunk in body:
                m("chunk")
                yield chunk

        async def timed_send(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.start":
                m("start1")
            elif message.get("body"):
                m("sent")

        self.body_iterator = chunks()
        await original_relay(self, scope, receive, timed_send)
        marks.end_request()

    relay_response.RelayResponse.__call__ = relay  # type: ignore[method-assign]


async def _serve_and_load(
    args: argparse.Namespace, workdir: Path
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """(direct requests' TTFB, the stage marks of requests through the gateway)."""
    from controller.config import load_config
    from controller.server import Server

    marks = Marks()
    instrument(marks)
    port = overhead._free_port()
    cmd = ["taskset", "-c", args.other_core, sys.executable, overhead.__file__]
    cmd += ["--upstream", str(port), "--chunks", str(args.chunks)]
    upstream = subprocess.Popen([*cmd, "--interval-ms", str(args.interval_ms)])
    server: Server | None = None
    try:
        url = f"http://127.0.0.1:{port}"
        overhead._wait_http(url + "/health")
        server = Server(load_config(overhead._start_gateway_config(url, workdir)), port=0)
        await server.startup()
        main_loop = asyncio.ensure_future(server.main_loop())
        out = workdir / "client.json"
        cmd = ["taskset", "-c", args.other_core, sys.executable, __file__, "--client", url]
        cmd += [f"http://127.0.0.1:{server.port}", str(args.requests + args.warmup), str(out)]
        client = await asyncio.create_subprocess_exec(*cmd, *([args.hint] if args.hint else []))
        await client.wait()
        server.should_exit = True
        await main_loop
        direct, sent = json.loads(out.read_text())
    finally:
        if server is not None:
            await server.shutdown()
        upstream.terminate()
        upstream.wait(30)
    rows = []
    for times, gateway in zip(sent, marks.done, strict=True):
        rows.append({**gateway, "client_send": times[0], "client_first": times[1]})
    return [{"direct_ttfb": first - sent} for sent, first in direct[args.warmup :]], rows[
        args.warmup :
    ]


async def client(upstream: str, gateway: str, num: int, out: str, hint: str | None) -> None:
    """Sequential streamed requests, ``num`` to the upstream directly, then ``num`` through
    the gateway; writes [direct, through], each [[sent, first body bytes], ...]."""
    import aiohttp

    payload = json.dumps(
        {
            "model": overhead.MODEL,
            "stream": True,
            "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
        }
    ).encode()
    headers = {"content-type": "application/json", **({"x-draftctl-task": hint} if hint else {})}
    both = []
    async with aiohttp.ClientSession() as session:
        for url in (upstream, gateway):
            times = []
            for _ in range(num):
                sent = time.perf_counter()
                first = None
                async with session.post(url + overhead._PATH, data=payload, headers=headers) as r:
                    async for _chunk in r.content.iter_any():
                        first = first or time.perf_counter()
                times.append([sent, first])
            both.append(times)
    Path(out).write_text(json.dumps(both))


def summarise(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    table = {}
    for name, start, end in STAGES:
        values = sorted((r[end] - r[start]) * 1e6 if start in r else 0.0 for r in rows)
        table[name] = {
            "p50_us": round(statistics.median(values), 1),
            "p90_us": round(values[int(0.9 * (len(values) - 1))], 1),
        }
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="measured requests")
    parser.add_argument("--warmup", type=int, default=5, help="requests before measuring")
    parser.add_argument("--chunks", type=int, default=16, help="SSE chunks per response")
    parser.add_argument(
        "--interval-ms", type=float, default=20.0, help="upstream pause between chunks"
    )
    parser.add_argument("--hint", choices=["math", "code", "chat"], help="skip the classifier")
    parser.add_argument("--gateway-core", default="0")
    parser.add_argument("--other-core", default="1")
    parser.add_argument("--json", action="store_true", help="print the JSON report only")
    parser.add_argument("--client", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        upstream, gateway, num, out, *hint = args.client
        asyncio.run(client(upstream, gateway, int(num), out, hint[0] if hint else None))
        return 0
    import uvloop

    os.sched_setaffinity(0, {int(c) for c in args.gateway_core.split(",")})
    load_before = overhead._load_average()
    with tempfile.TemporaryDirectory() as tmp:
        direct, rows = uvloop.run(_serve_and_load(args, Path(tmp)))
    direct_ttfb_us = statistics.median(r["direct_ttfb"] for r in direct) * 1e6
    report = {
        "command": "bench/gateway_timeline.py " + " ".join(sys.argv[1:]),
        "commit": overhead._git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": overhead._machine(),
        "classifier": overhead._classifier_state(args.hint),
        "requests": len(rows),
        "load_average_before": load_before,
        "load_average_after": overhead._load_average(),
        "stages": summarise(rows),
        "direct_ttfb_p50_us": round(direct_ttfb_us, 1),
    }
    if not args.json:
        for name, row in report["stages"].items():
            print(f"{name:11s} p50 {row['p50_us']:8.1f} us   p90 {row['p90_us']:8.1f} us")
        print(f"direct ttfb p50 {direct_ttfb_us:8.1f} us (same client, straight to the upstream)")
    print(json.dumps(report, indent=2) if args.json else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
