"""What is wrong with an answer, per issue 15's targets, and the tally of a run.

Per answer: a hang (no end within the client's timeout), a status >= 500 (only
``engine_error`` — a genuine engine failure — is told apart, and the suite expects none of
those either), a 200 with an empty body, a 200 that is not a whole completion (a non-stream
body without ``choices``; a stream without ``[DONE]`` or with an error event), a 4xx that is
not the OpenAI error shape ``{"error": {"message", "type", "param", "code"}}``, and a
connection that failed without the client leaving.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.robustness.client import Answer, Sent

ERROR_KEYS = {"message", "type", "param", "code"}
NUM_EXAMPLES_KEPT = 5  # per kind of problem, for the failure message


def openai_error(body: bytes) -> dict[str, Any] | None:
    """The ``error`` object of an OpenAI error body, or None if the body is not one."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    error = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(error, dict) or set(error) != ERROR_KEYS:
        return None
    if not isinstance(error["message"], str) or not error["message"]:
        return None
    if not isinstance(error["type"], str):
        return None
    if not all(error[k] is None or isinstance(error[k], str) for k in ("param", "code")):
        return None
    return error


def sse_events(body: bytes) -> list[bytes]:
    return [e.strip() for e in body.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


def stream_problem(body: bytes) -> str | None:
    """None for a whole stream: JSON chunks with choices, then ``[DONE]``."""
    events = sse_events(body)
    if not events:
        return "empty_200"
    for event in events[:-1]:
        try:
            chunk = json.loads(event.removeprefix(b"data: "))
        except ValueError:
            return "bad_stream"
        if not isinstance(chunk, dict):
            return "bad_stream"
        if "error" in chunk:
            return "stream_error"
    last = events[-1]
    if last != b"data: [DONE]":
        return "stream_error" if b'"error"' in last else "truncated_stream"
    return None


def whole_problem(body: bytes) -> str | None:
    if not body:
        return "empty_200"
    try:
        obj = json.loads(body)
    except ValueError:
        return "bad_200"
    if not isinstance(obj, dict) or not obj.get("choices"):
        return "bad_200"
    return None


def problem(answer: Answer, is_completion_stream: bool) -> str | None:
    """The kind of problem with ``answer``, or None if it meets every target."""
    if answer.is_left:
        return None
    if answer.is_hang:
        return "hang"
    if answer.transport_error is not None or answer.status is None:
        return "no_answer"
    status = answer.status
    if status >= 500:
        error = openai_error(answer.body)
        return "engine_error" if error and error["code"] == "engine_error" else "server_error"
    if 400 <= status < 500:
        return None if openai_error(answer.body) is not None else "bad_4xx"
    if status == 200 and is_completion_stream and "text/event-stream" in answer.content_type:
        return stream_problem(answer.body)
    if status == 200 and not answer.body:
        return "empty_200"
    return None


@dataclass
class Tally:
    """Counts by status and by problem, with a few examples of each problem."""

    num_requests: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    max_elapsed_s: float = 0.0

    def add(self, sent: Sent, answer: Answer, found: str | None) -> None:
        self.num_requests += 1
        key = "left" if answer.is_left else str(answer.status)
        self.statuses[key] += 1
        self.max_elapsed_s = max(self.max_elapsed_s, answer.elapsed_s)
        if found is not None:
            self.problems[found] += 1
            kept = self.examples.setdefault(found, [])
            if len(kept) < NUM_EXAMPLES_KEPT:
                shown = answer.body[:300]
                kept.append(f"{sent.describe()} -> {answer.status} {shown!r}")

    def figures(self) -> dict[str, Any]:
        num_5xx = sum(n for s, n in self.statuses.items() if s.isdigit() and int(s) >= 500)
        return {
            "requests": self.num_requests,
            "statuses": dict(sorted(self.statuses.items())),
            "answers_5xx": num_5xx,
            "hangs": self.problems["hang"],
            "empty_200s": self.problems["empty_200"],
            "non_openai_4xx": self.problems["bad_4xx"],
            "problems": dict(self.problems),
            "max_elapsed_s": round(self.max_elapsed_s, 3),
        }

    def report(self) -> str:
        lines = [f"{kind}: {n}" for kind, n in self.problems.items()]
        for kind, examples in self.examples.items():
            lines.append(f"--- {kind}")
            lines.extend(examples)
        return "\n".join(lines)
