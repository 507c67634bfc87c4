"""SGLang's speculative-decoding statistics -> draftctl's types (pure parsing, no I/O).

SGLang cannot be installed on the CPU machines draftctl is tested on, so these parsers are
tested against shapes recorded from SGLang's own source (tests/fixtures/sglang/README.md
names each file and commit). What SGLang writes:

* Per request, ``meta_info`` (native ``/generate``) carries ``spec_*`` fields, filled by
  ``TokenizerManager._calculate_spec_decoding_metrics`` (moved to
  ``managers/tokenizer_manager_components/spec_decoding_meta.py``). On the OpenAI routes a
  request with ``"return_spec_tokens_details": true`` gets the same fields as
  ``sglext.spec_tokens_details`` (``entrypoints/openai/utils.py``
  ``spec_tokens_details_from_meta_info``). The field names changed across releases, so
  every known spelling is read:

  - verify steps: ``spec_verify_ct``
  - accepted drafts: ``spec_num_correct_drafts`` | ``spec_accepted_drafts`` |
    ``spec_accept_token_num``
  - proposed drafts: ``spec_num_proposed_drafts`` | ``spec_proposed_drafts`` |
    ``spec_draft_token_num``
  - steps by drafts accepted: ``spec_correct_drafts_histogram`` | ``spec_accept_histogram``
  - ``spec_accept_length`` = completion_tokens / spec_verify_ct (bonus included)

* ``/metrics`` gauges (``srt/metrics/collector.py``): ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs`` and ``sglang:spec_accept_length`` (mean over the scheduler's
  last log interval; 0 before any speculative step).

SGLang's ``--speculative-num-draft-tokens`` is k + 1 (it counts the verified root token).
"""

from __future__ import annotations

import logging
from typing import Any

from engines.base import Outcome
from engines.prometheus_text import MetricsText, ScrapeSample
from engines.spec_counts import accepted_per_position, count, counts

log = logging.getLogger(__name__)

RUNNING = "sglang:num_running_reqs"
WAITING = "sglang:num_queue_reqs"
ACCEPT_LENGTH = "sglang:spec_accept_length"
WANTED_SERIES = (RUNNING, WAITING, ACCEPT_LENGTH)

_ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_PROPOSED_KEYS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def parse_sglang_meta(meta_info: dict[str, Any]) -> Outcome | None:
    """The Outcome in a ``meta_info`` / ``spec_tokens_details`` dict; None without speculation."""
    num_verify = count(meta_info.get("spec_verify_ct"))
    if not num_verify:
        return None
    num_output = count(meta_info.get("completion_tokens"))
    num_accepted = _first_count(meta_info, _ACCEPTED_KEYS)
    if num_accepted is None:
        num_accepted = _accepted_from_length(meta_info.get("spec_accept_length"), num_verify)
    histogram = _first_counts(meta_info, _HISTOGRAM_KEYS)
    by_position = counts(meta_info.get("spec_num_correct_drafts_by_position"))
    return Outcome(
        num_output_tokens=num_output,
        num_drafts=num_verify,
        num_draft_tokens=_first_count(meta_info, _PROPOSED_KEYS),
        num_accepted_tokens=num_accepted,
        accepted_per_position=by_position
        or (accepted_per_position(histogram) if histogram else []),
    )


def parse_sglang_response(body: dict[str, Any]) -> Outcome | None:
    """The Outcome in an SGLang response body or stream chunk, wherever SGLang put it.

    Looks at native ``meta_info``, then top-level ``sglext.spec_tokens_details``, then each
    choice's ``sglext``; fills ``num_output_tokens`` from ``usage`` when the details lack it.
    """
    details = _spec_details(body)
    if details is None:
        return None
    outcome = parse_sglang_meta(details)
    if outcome is not None and outcome.num_output_tokens is None:
        usage = body.get("usage")
        if isinstance(usage, dict):
            outcome.num_output_tokens = count(usage.get("completion_tokens"))
    return outcome


def sglang_scrape_sample(metrics: MetricsText, time_s: float) -> ScrapeSample:
    """The scrape snapshot from an SGLang ``/metrics`` page (summed / averaged over ranks)."""
    # 0 means "no speculative step logged yet"; an accept length is >= 1 by definition.
    lengths = [value for value in metrics.values(ACCEPT_LENGTH) if value >= 1.0]
    return ScrapeSample(
        time_s=time_s,
        running=metrics.total(RUNNING),
        waiting=metrics.total(WAITING),
        accept_length=sum(lengths) / len(lengths) if lengths else None,
    )


def _spec_details(body: dict[str, Any]) -> dict[str, Any] | None:
    meta = body.get("meta_info")
    if isinstance(meta, dict):
        return meta
    candidates = [body.get("sglext")]
    choices = body.get("choices")
    if isinstance(choices, list):
        candidates += [choice.get("sglext") for choice in choices if isinstance(choice, dict)]
    for sglext in candidates:
        if isinstance(sglext, dict) and isinstance(sglext.get("spec_tokens_details"), dict):
            details: dict[str, Any] = sglext["spec_tokens_details"]
            return details
    return None


def _accepted_from_length(accept_length: object, num_verify: int) -> int | None:
    # accept_length = completion_tokens / verify_ct = 1 + accepted / verify_ct
    if isinstance(accept_length, bool) or not isinstance(accept_length, int | float):
        return None
    if accept_length < 1.0:
        return None
    return round(accept_length * num_verify) - num_verify


def _first_count(meta: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = count(meta.get(key))
        if value is not None:
            return value
    return None


def _first_counts(meta: dict[str, Any], keys: tuple[str, ...]) -> list[int] | None:
    for key in keys:
        values = counts(meta.get(key))
        if values:
            return values
    return None
