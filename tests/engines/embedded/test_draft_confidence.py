"""The draft's own confidence per drafted position (issue 16): the top-1 probability of the
draft distribution, computed from the draft forward the step already ran and reported with
each step, for the controller to calibrate and allocate on."""

from __future__ import annotations

from pathlib import Path

import torch

from engines.embedded.events import SamplingParams, StepReport
from engines.embedded.request import Request
from tests.engines.embedded.conftest import make_engine, random_prompt


def test_reported_confidence_is_the_draft_top1_probability(
    agreeing_pair: tuple[Path, Path],
) -> None:
    engine = make_engine(agreeing_pair, max_batch_size=4)
    runner = engine.runner
    runner.measure_confidence = True
    original = runner._run
    drafted: list[torch.Tensor] = []

    def spy(name: str, *args: object, **kwargs: object) -> torch.Tensor:
        out = original(name, *args, **kwargs)  # type: ignore[arg-type]
        if name == "draft":
            drafted.append(out.clone())
        return out

    original_step = runner.step
    step_rows: list[list[str]] = []

    def step_spy(rows: list[Request], *args: object, **kwargs: object) -> object:
        step_rows.append([r.request_id for r in rows])
        return original_step(rows, *args, **kwargs)  # type: ignore[arg-type]

    runner._run = spy  # type: ignore[method-assign]
    runner.step = step_spy  # type: ignore[method-assign]
    ks = (7, 3, 0, 5)
    requests = [
        Request(
            f"r{i}",
            random_prompt(i),
            SamplingParams(max_new_tokens=24, temperature=0.0 if i % 2 == 0 else 0.8, seed=i),
            lambda view, k=k: k,
            {},
        )
        for i, k in enumerate(ks)
    ]
    for request in requests:
        engine.add(request)
    checked = 0
    while engine.has_work:
        before = len(drafted)
        events = engine.step()
        reports = [(r, e.report) for r, e in events if e.report is not None]
        if not reports or len(drafted) == before:
            continue
        logits = drafted[-1]
        rows = {request_id: i for i, request_id in enumerate(step_rows[-1])}
        for request, report in reports:
            assert isinstance(report, StepReport)
            assert len(report.draft_confidence) == report.spec_tokens
            if report.spec_tokens == 0:
                continue
            row = rows[request.request_id]
            temperature = request.params.temperature
            scaled = logits[row, : report.spec_tokens].float()
            if temperature > 0:
                scaled = scaled / temperature  # top-p / top-k off: plain temperature
            expected = torch.softmax(scaled, dim=-1).amax(dim=-1)
            got = torch.tensor(report.draft_confidence)
            assert torch.allclose(got, expected, atol=2e-3), (got, expected)
            assert ((got > 0) & (got <= 1)).all()
            checked += 1
    assert checked >= 6


def test_confidence_is_measured_only_when_asked(agreeing_pair: tuple[Path, Path]) -> None:
    """Two reductions over the vocabulary per step: off unless a reader asks (the flag, or a
    two-phase step), and then the report says so with an empty tuple."""
    engine = make_engine(agreeing_pair, max_batch_size=1)
    request = Request("r", random_prompt(0), SamplingParams(max_new_tokens=8), lambda v: 4, {})
    engine.add(request)
    reports = []
    while engine.has_work:
        reports += [e.report for _, e in engine.step() if getattr(e, "report", None)]
    assert reports and all(r.draft_confidence == () for r in reports)
