"""vLLM's speculative-decoding statistics -> draftctl's types (pure parsing, no I/O).

Shapes, as vLLM 0.32 writes them (read from the installed package; recorded from a real
CPU server in tests/fixtures/vllm/):

* Per request, when the server runs with ``--per-request-spec-decode-metrics summary``:
  ``metrics.speculative_decoding`` on the non-streaming body, and on the final usage chunk
  of a stream (only sent when ``stream_options.include_usage`` is true)::

      {"mean_acceptance_length": 1.6, "draft_acceptance_rate": 0.09,
       "acceptance_histogram": [9, 4, 2, 0, 0, 0, 0, 0],   # index j: verify steps that
                                                           # accepted exactly j drafts
       "num_spec_steps": 15, "num_accepted_draft_tokens": 8,
       "num_draft_tokens": 105, "num_spec_tokens": 7,
       "per_step_accepted": null, "per_step_drafted": null}  # lists at level "detailed"

  (vllm/entrypoints/generate/base/protocol.py ``SpeculativeDecodingMetrics``,
  vllm/v1/metrics/stats.py ``RequestSpecDecodeMetrics.to_dict``; ``null`` for ``n > 1``.)
* ``/metrics`` counters (vllm/v1/spec_decode/metrics.py ``SpecDecodingProm``), labelled
  ``{engine, model_name}``: ``vllm:spec_decode_num_drafts_total``,
  ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and
  ``..._num_accepted_tokens_per_pos_total{position="0".."k-1"}``; gauges
  ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (vllm/v1/metrics/loggers.py).
  A server without speculation has no ``spec_decode`` series at all.
"""

from __future__ import annotations

import logging
from typing import Any

from engines.base import Outcome
from engines.prometheus_text import MetricsText, ScrapeSample
from engines.spec_counts import accepted_per_position, count, counts

log = logging.getLogger(__name__)

NUM_DRAFTS = "vllm:spec_decode_num_drafts_total"
NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WANTED_SERIES = (
    NUM_DRAFTS,
    NUM_DRAFT_TOKENS,
    NUM_ACCEPTED_TOKENS,
    ACCEPTED_PER_POS,
    RUNNING,
    WAITING,
)


def parse_vllm_response_metrics(body: dict[str, Any]) -> Outcome | None:
    """The Outcome in a response body or final usage chunk; None when it carries none.

    Malformed metrics (wrong types, negative counts) are logged and read as "not reported":
    an upstream quirk must never fail the client's request.
    """
    metrics = body.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    num_steps = count(spec.get("num_spec_steps"))
    num_accepted = count(spec.get("num_accepted_draft_tokens"))
    histogram = counts(spec.get("acceptance_histogram"))
    if num_steps is None or num_accepted is None or histogram is None:
        log.warning("ignoring malformed vLLM metrics.speculative_decoding: %r", spec)
        return None
    per_step = counts(spec.get("per_step_accepted")) or []
    return Outcome(
        num_output_tokens=_completion_tokens(body),
        num_drafts=num_steps,
        num_draft_tokens=count(spec.get("num_draft_tokens")),
        num_accepted_tokens=num_accepted,
        accepted_per_position=accepted_per_position(histogram),
        accept_lengths=[accepted + 1 for accepted in per_step],
    )


def vllm_scrape_sample(metrics: MetricsText, time_s: float) -> ScrapeSample:
    """The scrape snapshot from a vLLM ``/metrics`` page (series summed over engines)."""
    by_position = metrics.total_by_label(ACCEPTED_PER_POS, "position")
    return ScrapeSample(
        time_s=time_s,
        running=metrics.total(RUNNING),
        waiting=metrics.total(WAITING),
        num_drafts=metrics.total(NUM_DRAFTS),
        num_draft_tokens=metrics.total(NUM_DRAFT_TOKENS),
        num_accepted_tokens=metrics.total(NUM_ACCEPTED_TOKENS),
        accepted_per_position=_ordered_positions(by_position),
    )


def _ordered_positions(by_position: dict[str, float]) -> tuple[float, ...]:
    try:
        positions = sorted((int(key), value) for key, value in by_position.items())
    except ValueError:
        log.warning("ignoring non-integer vLLM position labels: %r", sorted(by_position))
        return ()
    if [position for position, _ in positions] != list(range(len(positions))):
        log.warning("ignoring gappy vLLM position labels: %r", sorted(by_position))
        return ()
    return tuple(value for _, value in positions)


def _completion_tokens(body: dict[str, Any]) -> int | None:
    usage = body.get("usage")
    return count(usage.get("completion_tokens")) if isinstance(usage, dict) else None
