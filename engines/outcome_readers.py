"""Which parser reads a backend kind's per-request speculation metrics.

The parsers live in engines/vllm_stats.py and engines/sglang_stats.py (pure functions);
this table only picks one per pool kind.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from engines.base import Outcome
from engines.sse import OutcomeReader

log = logging.getLogger(__name__)

# kind -> (module, function); the function takes a usage chunk or a whole response body.
_READERS: dict[str, tuple[str, str]] = {
    "vllm": ("engines.vllm_stats", "parse_vllm_response_metrics"),
    "sglang": ("engines.sglang_stats", "parse_sglang_response"),
}


def _none(body: dict[str, Any]) -> Outcome | None:
    return None


def reader_for(kind: str) -> OutcomeReader:
    """The metrics reader for ``kind``; one that reports nothing if the parser is missing."""
    if kind not in _READERS:
        return _none
    module_name, function = _READERS[kind]
    try:
        reader: OutcomeReader = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as exc:
        log.warning("no per-request metrics for %s pools: %s", kind, exc)
        return _none
    return reader
