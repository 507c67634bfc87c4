"""Synthetic draft confidence (issue 16, benchmark only): with random weights the draft's own
confidence means nothing, so a synthetic-acceptance step that reads confidence reports one
drawn from the step's own run, with the AUC the trained pair measured on the H200."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import RequestView, SamplingParams, SpecController, StepReport
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from engines.embedded.synthetic import SyntheticAcceptance
from engines.embedded.synthetic_profiles import PROFILES_PATH, load_profile_set
from policies.confidence_model import auc
from tests.engines.embedded.conftest import BLOCK_SIZE, random_prompt

N = BLOCK_SIZE - 1
Pair = tuple[Path, Path]


def draws(
    synthetic: SyntheticAcceptance, task: str, num_keys: int, num_steps: int
) -> tuple[list[str], list[int], np.ndarray, np.ndarray]:
    keys = [f"k{i}" for i in range(num_keys) for _ in range(num_steps)]
    steps = [s for _ in range(num_keys) for s in range(num_steps)]
    runs = synthetic.accept_runs([task] * len(keys), keys, steps, 15)
    return keys, steps, runs, synthetic.draft_confidence(keys, steps, runs, 15)


@pytest.mark.parametrize("task", ["math", "chat"])
def test_confidence_has_the_configured_auc_against_survival(task: str) -> None:
    synthetic = load_profile_set(seed=3)
    assert synthetic.confidence_auc == 0.78  # the file's: the testbed pair on the H200
    _, _, runs, confidence = draws(synthetic, task, 400, 20)
    survives = np.arange(15)[None, :] < runs[:, None]
    assert abs(auc(confidence, survives) - 0.78) < 0.03
    # as a trained pair's is measured: positions after the first rejection censored
    seen = np.arange(15)[None, :] <= runs[:, None]
    assert abs(auc(confidence[seen], survives[seen]) - 0.78) < 0.03
    assert ((confidence > 0) & (confidence < 1)).all()


def test_confidence_is_a_pure_function_of_seed_key_and_step() -> None:
    synthetic = load_profile_set(seed=3)
    keys, steps, runs, confidence = draws(synthetic, "code", 20, 5)
    again = synthetic.draft_confidence(keys[::-1], steps[::-1], runs[::-1], 7)
    assert np.array_equal(again[::-1], confidence[:, :7])  # any order, batch or k
    other = replace(synthetic, seed=4).draft_confidence(keys, steps, runs, 15)
    assert not np.array_equal(other, confidence)
    assert synthetic.describe()["confidence_auc"] == 0.78


def test_the_profile_file_checks_the_confidence_keys(tmp_path: Path) -> None:
    text = PROFILES_PATH.read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("confidence_auc: 0.78", "confidence_auc: 1.2"))
    with pytest.raises(ValueError, match="confidence_auc"):
        load_profile_set(path=bad)
    bad.write_text(text.replace("[testbed-h200-confidence]", "[nowhere]"))
    with pytest.raises(ValueError, match="confidence_sources"):
        load_profile_set(path=bad)
    with pytest.raises(ValueError, match="AUC"):
        SyntheticAcceptance(load_profile_set().profiles, confidence_auc=0.3)


class _AllocateHalf:
    """A two-phase planner that drafts every row fully, keeps what allocate was given, and
    verifies the first half of each row's drafts."""

    def __init__(self) -> None:
        self.seen: list[tuple[list[RequestView], list[list[float]]]] = []

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        return [N] * len(views)

    def record(self, controllers: Sequence[SpecController], reports: Sequence[StepReport]) -> None:
        return None

    def prepare(self, views: Sequence[RequestView], controllers: Sequence[SpecController]) -> None:
        return None

    def allocates(self) -> bool:
        return True

    def allocate(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        confidence: Sequence[Sequence[float]],
    ) -> list[int]:
        self.seen.append((list(views), [list(c) for c in confidence]))
        return [len(c) // 2 for c in confidence]


def _engine(pair: Pair, synthetic: SyntheticAcceptance) -> Engine:
    runner = load_runner(pair[0], pair[1], torch.device("cpu"), 8, 256, synthetic=synthetic)
    return Engine(runner, 8, 256)


def _requests(count: int, k: int = N) -> list[Request]:
    return [
        Request(
            f"r{i}",
            random_prompt(60 + i),
            SamplingParams(max_new_tokens=40),
            lambda view: k,
            {"task": ("math", "chat")[i % 2], "synthetic_key": f"key-{i}"},
        )
        for i in range(count)
    ]


def _expected(synthetic: SyntheticAcceptance, view: RequestView) -> list[float]:
    task, key = synthetic.identity(view.request_id, view.context)
    run = synthetic.accept_runs([task], [key], [view.step_index], 15)
    return synthetic.draft_confidence([key], [view.step_index], run, 15)[0].tolist()


def test_two_phase_steps_allocate_on_the_drawn_confidence(tiny_pair: Pair) -> None:
    synthetic = load_profile_set(seed=5)
    engine = _engine(tiny_pair, synthetic)
    planner = _AllocateHalf()
    engine.planner = planner
    requests = _requests(4)
    for request in requests:
        engine.add(request)
    reports: list[StepReport] = []
    while engine.has_work:
        reports += [e.report for _, e in engine.step() if getattr(e, "report", None)]
    assert len(planner.seen) > 5
    for views, confidence in planner.seen:
        for view, values in zip(views, confidence, strict=True):
            assert values == _expected(synthetic, view)[: len(values)]
    # reported: the allocated k's positions of the same draws
    assert all(len(r.draft_confidence) == r.spec_tokens for r in reports)
    assert all(r.spec_tokens <= N // 2 for r in reports)


def test_measured_steps_report_the_drawn_confidence(tiny_pair: Pair) -> None:
    """``runner.measure_confidence`` in synthetic mode: each report carries the drawn
    confidence of its own step and positions; unmeasured steps report none."""
    synthetic = load_profile_set(seed=6)
    engine = _engine(tiny_pair, synthetic)
    engine.runner.measure_confidence = True
    views: dict[tuple[str, int], RequestView] = {}

    def controller(view: RequestView) -> int:
        views[view.request_id, view.step_index] = view
        return 5

    requests = _requests(3)
    for request in requests:
        engine.add(replace(request, controller=controller))
    checked = 0
    while engine.has_work:
        for request, event in engine.step():
            report = getattr(event, "report", None)
            if report is None or report.spec_tokens == 0:
                continue
            view = views[request.request_id, len(request.accept_lengths) - 1]
            expected = _expected(synthetic, view)[: report.spec_tokens]
            assert report.draft_confidence == pytest.approx(expected)
            checked += 1
    assert checked > 10
    plain = _engine(tiny_pair, synthetic)
    plain.add(_requests(1, k=5)[0])
    reports = []
    while plain.has_work:
        reports += [e.report for _, e in plain.step() if getattr(e, "report", None)]
    assert reports and all(r.draft_confidence == () for r in reports)
