"""Request.append: the length limit and the first stop token decide what a step keeps and why
the request finishes (the engine's per-row bookkeeping, rewritten in session 28 without a
per-token loop over the length)."""

from __future__ import annotations

import pytest

from engines.embedded.events import SamplingParams
from engines.embedded.request import Request


def make(max_new: int, stops: tuple[int, ...] = (), generated: int = 0) -> Request:
    params = SamplingParams(max_new_tokens=max_new, stop_token_ids=stops)
    request = Request("r", [1, 2, 3], params, lambda view: 0, {})
    request.output_ids.extend(range(100, 100 + generated))
    return request


@pytest.mark.parametrize(
    ("max_new", "stops", "generated", "tokens", "kept", "reason"),
    [
        (10, (), 0, [5, 6, 7], [5, 6, 7], None),  # room left
        (10, (), 7, [5, 6, 7], [5, 6, 7], "length"),  # exactly fills
        (10, (), 8, [5, 6, 7], [5, 6], "length"),  # cut at the limit
        (10, (), 10, [5], [], "length"),  # no room
        (10, (6,), 0, [5, 6, 7], [5, 6], "stop"),  # the first stop ends it
        (10, (6, 5), 0, [5, 6, 7], [5], "stop"),
        (10, (7,), 8, [5, 6, 7], [5, 6], "length"),  # the stop past the limit is not kept
        (10, (6,), 8, [5, 6, 7], [5, 6], "stop"),  # a stop that fills the limit is a stop
        (10, (9,), 0, [], [], None),
    ],
)
def test_append_keeps_up_to_the_limit_and_the_first_stop(
    max_new: int,
    stops: tuple[int, ...],
    generated: int,
    tokens: list[int],
    kept: list[int],
    reason: str | None,
) -> None:
    request = make(max_new, stops, generated)
    before = list(request.output_ids)
    assert request.append(tokens) == kept
    assert request.output_ids == before + kept
    assert request.finish_reason == reason
