"""Bookkeeping that waits until the request path next yields to the event loop.

Counting a request or observing a latency histogram changes nothing the client sees, yet
on a request's path it costs time-to-first-byte: after an idle spell every line of Python
runs several times slower than warm (bench/gateway_timeline.py measures it), and the
request path already runs ~1 ms of such code. ``after_first_byte`` queues the call with
``loop.call_soon``: it then runs when the request task first waits — for the upstream's
answer once the request is written, or for its next chunk once the first went out — in
time the loop would otherwise spend idle. Outside a running loop it calls at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVarTuple

Args = TypeVarTuple("Args")


def after_first_byte(fn: Callable[[*Args], object], *args: *Args) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        fn(*args)
        return
    loop.call_soon(fn, *args)
