"""What handing a step's events from the engine thread to the consumers' event loop costs the
engine thread: one ``call_soon_threadsafe`` per event (each wakes the loop through its
self-pipe) against one per step for all its events (``AsyncEngine._deliver_step``).

    .venv/bin/python bench/loop_handover.py --out bench/results/loop_handover_cpu.json \\
        [--rows 64] [--steps 2000] [--rounds 5]

An event loop runs in a thread of its own, as the daemon's does; the timing thread plays the
engine thread and hands ``--rows`` items a step to an ``asyncio.Queue`` either way, the two
ways alternating in a seeded random order over ``--rounds`` rounds. Reports microseconds of
the engine thread per event (median and every round), and the JSON with the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--rows", type=int, default=64, help="events a step (default 64)")
    parser.add_argument("--steps", type=int, default=2000, help="steps a round (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each way (default 5)")
    parser.add_argument("--seed", default="0", help="seed of the rounds' order")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.steps < 1 or args.rounds < 1:
        parser.error("--rows, --steps and --rounds must be >= 1")
    return args


def _put_all(queue: asyncio.Queue[Any], items: list[int]) -> None:
    for item in items:
        queue.put_nowait(item)


def one_round(
    loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any], rows: int, steps: int, batched: bool
) -> float:
    """Engine-thread microseconds per event, handing ``steps`` steps of ``rows`` events."""
    items = list(range(rows))
    started = time.perf_counter()
    for _ in range(steps):
        if batched:
            loop.call_soon_threadsafe(_put_all, queue, items)
        else:
            for item in items:
                loop.call_soon_threadsafe(queue.put_nowait, item)
    elapsed = time.perf_counter() - started
    drained = asyncio.run_coroutine_threadsafe(_drain(queue, rows * steps), loop)
    drained.result(timeout=120)
    return 1e6 * elapsed / (rows * steps)


async def _drain(queue: asyncio.Queue[Any], count: int) -> None:
    for _ in range(count):
        await queue.get()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def make_queue() -> asyncio.Queue[Any]:
        return asyncio.Queue()

    queue = asyncio.run_coroutine_threadsafe(make_queue(), loop).result()
    order = [True, False] * args.rounds
    random.Random(args.seed).shuffle(order)
    runs: dict[str, list[float]] = {"per_event": [], "per_step": []}
    one_round(loop, queue, args.rows, 10, True)  # warm-up
    try:
        for batched in order:
            value = one_round(loop, queue, args.rows, args.steps, batched)
            runs["per_step" if batched else "per_event"].append(value)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
    summary = {
        name: {
            "median_us_per_event": round(statistics.median(values), 3),
            "rounds_us_per_event": [round(v, 3) for v in values],
        }
        for name, values in runs.items()
    }
    result = {
        "command": " ".join(
            ["bench/loop_handover.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": "cpu",
        "python": sys.version.split()[0],
        "rows": args.rows,
        "steps": args.steps,
        "order": ["per_step" if b else "per_event" for b in order],
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
