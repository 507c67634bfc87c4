"""``POST /admin/policy/whatif``: a posted policy on the traffic this daemon recorded.

Body: policy YAML (the editor's text). Answer: ``draftctl simulate --replay`` 's JSON report
for the last ``window_s`` of the trace (query ``?window_s=``, default an hour), the posted
policy against the running one replayed on the same requests (``delta``), and the running
policy's replay against what was recorded (``reproduction_error``). Never applies anything.

The simulation runs in a child process (``python -m controller.cli simulate``): the daemon
never imports the simulator, and a replay's CPU time is not spent on the serving process's
event loop or GIL. One what-if at a time (a second gets a 429), each bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from controller.admin import AdminAPI, read_text
from controller.config import RecordingConfig
from controller.openai_errors import ApiError

log = logging.getLogger(__name__)

_DEFAULT_WINDOW_S = 3600.0
_TIMEOUT_S = 120.0


class WhatIf:
    def __init__(self, recording: RecordingConfig, running_text: Callable[[], str]):
        self._recording = recording
        self._running_text = running_text
        self._lock = asyncio.Lock()

    async def run(self, request: Request) -> Response:
        if not self._recording.enabled:
            raise ApiError(
                409,
                "recording is off, so there is no served traffic to replay; set "
                "recording.enabled: true in config.yaml and restart",
                code="recording_off",
            )
        if self._lock.locked():
            raise ApiError(429, "a what-if is already running; retry when it ends", code="busy")
        window_s = _window(request.query_params.get("window_s"))
        text = await read_text(request)
        async with self._lock:
            report = await self._simulate(text, window_s)
        return Response(json.dumps(report), media_type="application/json")

    async def _simulate(self, text: str, window_s: float) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="draftctl-whatif-") as folder:
            edited, running = Path(folder) / "edited.yaml", Path(folder) / "running.yaml"
            await asyncio.to_thread(edited.write_text, text)
            await asyncio.to_thread(running.write_text, self._running_text())
            argv = [
                sys.executable, "-m", "controller.cli", "--log-level", "error", "simulate",
                "--replay", str(self._recording.path), "--policy", str(edited),
                "--recorded-policy", str(running), "--last", str(window_s), "--json",
            ]  # fmt: skip
            child = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            try:
                out, err = await asyncio.wait_for(child.communicate(), _TIMEOUT_S)
            except TimeoutError:
                child.kill()
                await child.wait()
                # The window the client asked for is what makes it long: a 4xx it can act on.
                raise ApiError(
                    422, f"the what-if took over {_TIMEOUT_S:.0f} s; try a shorter window_s",
                    code="whatif_timeout",
                ) from None  # fmt: skip
        if child.returncode != 0:
            message = err.decode(errors="replace").strip().splitlines()
            detail = message[-1] if message else f"exit status {child.returncode}"
            raise ApiError(422, f"cannot replay the trace: {detail}", code="whatif_failed")
        report: dict[str, Any] = json.loads(out)
        report["window_s"] = window_s
        return report


def _window(raw: str | None) -> float:
    if raw is None:
        return _DEFAULT_WINDOW_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e9:
        raise ApiError(400, f"window_s={raw[:40]!r}: give seconds > 0", code="bad_window")
    return value


def whatif_routes(api: AdminAPI, whatif: WhatIf) -> list[BaseRoute]:
    return [Route("/admin/policy/whatif", api.guarded(whatif.run), methods=["POST"])]
