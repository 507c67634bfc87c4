"""Per pool kind: how a request asks for per-request speculation metrics, and how they are read.

The parsers live in engines/vllm_stats.py and engines/sglang_stats.py (pure functions).
vLLM reports them when its servers run with ``--per-request-spec-decode-metrics summary``;
SGLang's OpenAI routes report them when the request says ``return_spec_tokens_details``.
"""

from __future__ import annotations

from typing import Any

from engines.base import Outcome
from engines.sglang_stats import parse_sglang_response
from engines.sse import OutcomeReader
from engines.vllm_stats import parse_vllm_response_metrics


def _none(body: dict[str, Any]) -> Outcome | None:
    return None


_READERS: dict[str, OutcomeReader] = {
    "vllm": parse_vllm_response_metrics,
    "sglang": parse_sglang_response,
}


def reader_for(kind: str) -> OutcomeReader:
    """The metrics reader for ``kind`` (one that reports nothing for unknown kinds)."""
    return _READERS.get(kind, _none)


def request_extras(kind: str, spec_tokens: int) -> dict[str, Any]:
    """Body fields that make a ``kind`` server report this request's speculation."""
    if kind == "sglang" and spec_tokens > 0:
        return {"return_spec_tokens_details": True}
    return {}
