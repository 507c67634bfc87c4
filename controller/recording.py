"""The served-traffic trace: one compact JSON line per finished request, never prompt text.

``recording.enabled`` turns it on (config.yaml). The gateway hands each finished request's
record to ``TraceRecorder.record``, which only puts it on a bounded queue: a background
thread encodes and writes the lines in batches, so the event loop never waits on the disk.
A full queue drops the record and a failed write drops the batch; both are counted and
logged (once a minute at most), never raised to a client. Past ``recording.max_bytes`` the
file is rotated (``served.jsonl`` -> ``served.jsonl.1`` -> ...), ``recording.max_files`` kept.

Every file starts with a header line (``"type": "engine"``) per backend that describes what
a replay needs to price its steps: block size, batch limit and, for the embedded engine, its
measured step-cost table. Request lines carry ``"type": "request"`` (format in docs/bench.md).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from controller.config import RecordingConfig
from controller.planner import Plan
from engines.base import Backend, BackendResponse

log = logging.getLogger(__name__)

TRACE_VERSION = 1
_MAX_QUEUED = 20_000  # records waiting for the writer; more are dropped (counted)
_BATCH = 512  # records written per file write at most
_WARN_EVERY_S = 60.0


class TraceRecorder:
    """Bounded, rotated JSONL trace written off the event loop (see the module docstring)."""

    def __init__(self, config: RecordingConfig, headers: Callable[[], list[dict[str, Any]]]):
        """``headers``: the engine lines written at the top of every file (read when a file
        is opened, so a cost table measured at start-up is in it)."""
        self.path = config.path
        self.max_bytes = config.max_bytes
        self.max_files = config.max_files
        self._headers = headers
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(_MAX_QUEUED)
        self._thread: threading.Thread | None = None
        self._size = -1  # bytes in the current file; -1 until the writer has opened it
        self.num_written = 0
        self.num_dropped = 0
        self._warned_s = -_WARN_EVERY_S

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trace-recorder", daemon=True)
        self._thread.start()

    def record(self, entry: dict[str, Any]) -> None:
        """Queue one request's line (never blocks; drops it when the queue is full)."""
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            self._dropped(1, "the writer is behind (queue full)")

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (up to ``timeout_s``) and stop the writer."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            log.warning("trace recorder: queue full at shutdown; queued records are lost")
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        is_open = True
        while is_open:
            batch = [self._queue.get()]
            while len(batch) < _BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            is_open = None not in batch
            entries = [e for e in batch if e is not None]
            if entries:
                self._write(entries)

    def _write(self, entries: list[dict[str, Any]]) -> None:
        try:
            lines = [orjson.dumps(e) + b"\n" for e in entries]
        except (TypeError, ValueError) as exc:
            self._dropped(len(entries), f"a record is not JSON: {exc}")
            return
        while lines:
            try:
                lines = lines[self._append(lines) :]
            except OSError as exc:
                self._size = -1  # reopen (and rewrite the header) next time
                self._dropped(len(lines), f"cannot write {self.path}: {exc}")
                return

    def _append(self, lines: list[bytes]) -> int:
        """Append the lines that fit in the current file (a new one when none fits)."""
        if self._size < 0 or self._size + len(lines[0]) > self.max_bytes:
            self._open_new()
        count, size = 0, self._size
        while count < len(lines) and (count == 0 or size + len(lines[count]) <= self.max_bytes):
            size += len(lines[count])
            count += 1
        with self.path.open("ab") as handle:
            handle.write(b"".join(lines[:count]))
        self._size = size
        self.num_written += count
        return count

    def _open_new(self) -> None:
        """Rotate the current file away (when it has content) and start one with headers."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size > 0:
            rotate(self.path, self.max_files)
        header = b"".join(orjson.dumps(h) + b"\n" for h in self._headers())
        self.path.write_bytes(header)
        self._size = len(header)

    def _dropped(self, count: int, why: str) -> None:
        self.num_dropped += count
        now = time.monotonic()
        if now - self._warned_s >= _WARN_EVERY_S:
            self._warned_s = now
            log.warning("trace recorder dropped %d record(s) so far: %s", self.num_dropped, why)


def rotate(path: Path, max_files: int) -> None:
    """path.(n-1) -> path.n ... path -> path.1; the oldest beyond ``max_files`` is deleted."""
    oldest = path.with_name(f"{path.name}.{max_files - 1}") if max_files > 1 else path
    oldest.unlink(missing_ok=True)
    for index in range(max_files - 2, 0, -1):
        source = path.with_name(f"{path.name}.{index}")
        if source.exists():
            source.replace(path.with_name(f"{path.name}.{index + 1}"))
    if max_files > 1 and path.exists():
        path.replace(path.with_name(f"{path.name}.1"))


def trace_files(path: Path) -> list[Path]:
    """The trace at ``path`` and its rotated files that exist, oldest first."""
    rotated = sorted(
        (p for p in path.parent.glob(f"{path.name}.*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [*rotated, *([path] if path.exists() else [])]


def request_line(
    plan: Plan,
    backend: Backend,
    spec_tokens: int,
    response: BackendResponse,
    started_s: float,
    first_s: float | None,
    end_s: float,
) -> dict[str, Any]:
    """One finished request's trace line (``*_s`` arguments: ``time.perf_counter`` times)."""
    outcome = response.outcome
    arrival_s = time.time() - (time.perf_counter() - started_s)
    scores = plan.task_scores
    probabilities = None if scores is None else {t.value: round(p, 4) for t, p in scores.items()}
    return {
        "type": "request",
        "t": round(arrival_s, 4),
        "task": plan.task.value,
        "task_source": plan.task_source,
        "task_probabilities": probabilities,
        "backend": backend.name,
        "spec_tokens": spec_tokens,
        "reason": outcome.reason or plan.decision.reason,
        "concurrency": plan.concurrency,
        "prompt_tokens": outcome.num_prompt_tokens,
        "output_tokens": outcome.num_output_tokens,
        "ttft_ms": None if first_s is None else round(1e3 * (first_s - started_s), 2),
        "decode_ms": None if outcome.decode_s is None else round(1e3 * outcome.decode_s, 2),
        "latency_ms": round(1e3 * (end_s - started_s), 2),
        "accept_lengths": outcome.accept_lengths,
        "step_spec_tokens": outcome.step_spec_tokens,
        "num_plain_steps": len(outcome.plain_step_times_s),
        # Measured step times (embedded engine): replay calibrates its step costs with them.
        "step_ms": [round(1e3 * t, 2) for t in outcome.step_times_s],
        "plain_step_ms": [round(1e3 * t, 2) for t in outcome.plain_step_times_s],
        "num_drafts": outcome.num_drafts,
        "num_accepted_tokens": outcome.num_accepted_tokens,
        "policy_version": plan.running.version,
        "error": response.error is not None,
    }


def engine_header(backend: Backend, max_batch_size: int | None) -> dict[str, Any]:
    """A backend's header line: what a replay needs to price its steps."""
    steps = getattr(backend, "steps", None)  # the embedded engine's step controller
    table = getattr(steps, "cost_table", None)
    return {
        "type": "engine",
        "version": TRACE_VERSION,
        "backend": backend.name,
        "kind": backend.kind,
        "model": backend.model,
        "block_size": backend.block_size,
        "max_spec_tokens": backend.max_spec_tokens,
        "is_adjustable": backend.is_adjustable,
        "max_batch_size": max_batch_size,
        "cost_table": None if table is None else table.to_dict(),
    }
