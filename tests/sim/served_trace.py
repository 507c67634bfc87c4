"""Hand-written served traces (controller/recording.py's format, docs/bench.md) for the replay
and traffic-log tests: one embedded engine "e" of block 8 and its cost table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TABLE = {
    "batch_sizes": [1, 2, 4, 8],
    "tokens_per_request": [1, 8],
    "step_time_s": [[0.010, 0.020], [0.012, 0.026], [0.015, 0.035], [0.020, 0.060]],
    "includes_draft": True,
}
HEADER = {"type": "engine", "backend": "e", "block_size": 8, "max_batch_size": 8,
          "cost_table": TABLE}  # fmt: skip


def request_line(
    t: float,
    lengths: list[int],
    ks: list[int],
    task: str = "math",
    latency_ms: float = 100.0,
    prompt_tokens: int = 20,
) -> dict[str, Any]:
    """A finished request's line: its drafting steps' accept lengths and k (none: k = 0)."""
    return {
        "type": "request", "t": t, "task": task, "backend": "e", "spec_tokens": max(ks or [0]),
        "concurrency": 1, "prompt_tokens": prompt_tokens, "output_tokens": 1 + sum(lengths),
        "ttft_ms": 10.0, "decode_ms": latency_ms - 10.0, "latency_ms": latency_ms,
        "accept_lengths": lengths, "step_spec_tokens": ks, "num_plain_steps": 0 if ks else 12,
        "step_ms": [20.0] * len(lengths), "plain_step_ms": [], "error": False,
    }  # fmt: skip


def write_trace(
    path: Path, lines: list[dict[str, Any]], header: dict[str, Any] | None = None
) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in [header or HEADER, *lines]))
    return path
