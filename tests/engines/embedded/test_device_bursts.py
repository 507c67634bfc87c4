"""Device-allocated two-phase steps in drafting bursts (issue 16): ``spec_steps`` with a
``scoring`` runs several two-phase steps with one host round trip, each step's allocation
scoring that step's own draft confidence with the burst's one scoring (its tables and budget).
A burst gives what the same single steps give; greedy output stays the target's own; the
planner is told every step of every burst."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams, TokenEvent
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from engines.embedded.runner import StepResult
from engines.embedded.synthetic_profiles import load_profile_set
from engines.step_controller import StepController
from policies.model import GoodputSpec
from policies.slot_scoring import SlotScoring
from policies.types import Task
from tests.engines.embedded.conftest import BLOCK_SIZE, greedy_request, random_prompt, run_all
from tests.engines.embedded.test_device_allocation import RandomDeviceScoring, random_scoring
from tests.engines.embedded.test_lossless import PROMPT_LEN, target_only_greedy
from tests.engines.embedded.test_two_phase import (
    assert_bounded,
    counted_observations,
    goodput_controller,
)

N = BLOCK_SIZE - 1
Pair = tuple[Path, Path]
STEPS = 4


def _admitted(
    pair: Pair, synthetic: bool, graphs: bool, rows: int, sampled: bool = False
) -> tuple[Any, list[Request]]:
    """A runner with ``rows`` prefilled requests (long enough for a burst of ``STEPS`` at
    k = N), on the eager path or the ragged static calls; synthetic acceptance with drawn
    confidence, or the pair's own; ``sampled``: every other row samples (temperature 0.8)."""
    options: dict[str, Any] = {"use_cuda_graphs": True, "verify_mode": "ragged"} if graphs else {}
    if synthetic:
        options["synthetic"] = load_profile_set(seed=11)
    runner = load_runner(*pair, torch.device("cpu"), 4, 256, **options)
    engine = Engine(runner, 4, 256)
    for i in range(rows):
        context = {"task": ("math", "code", "chat")[i % 3], "synthetic_key": f"key-{i}"}
        engine.add(
            Request(
                f"q{i}",
                random_prompt(500 + i, PROMPT_LEN),
                SamplingParams(
                    max_new_tokens=120,
                    temperature=0.8 if sampled and i % 2 == 0 else 0.0,
                    top_p=0.9,
                    seed=40 + i,
                ),
                lambda view: 0,
                context if synthetic else {},
            )
        )
    admitted = engine.scheduler.admit()
    engine._prefill_admitted(admitted)
    return runner, admitted


def _advance(rows: list[Request], result: StepResult) -> None:
    """What the engine's postprocessing does to each row after a step."""
    for i, request in enumerate(rows):
        request.accept_lengths.append(len(result.new_tokens[i]))
        request.spec_tokens.append((result.spec_tokens or [])[i])
        request.append(result.new_tokens[i])


@pytest.mark.parametrize(
    ("synthetic", "graphs", "sampled"),
    [(False, False, False), (False, False, True), (True, False, False), (True, True, True)],
)
def test_a_device_allocated_burst_is_its_single_steps(
    agreeing_pair: Pair, tiny_pair: Pair, synthetic: bool, graphs: bool, sampled: bool
) -> None:
    """A burst of 4 device-allocated steps under one scoring gives each step's tokens, accept
    masks, verified k and confidence as 4 single device-allocated steps with that scoring and
    the same uniforms do (greedy rows, and sampled rows mixed in): each step's allocation read
    that step's own confidence (the verified k change from step to step), the budget held in
    every step."""
    pair = tiny_pair if synthetic else agreeing_pair
    rows = 3
    scoring = random_scoring(np.random.default_rng(3), rows, N, budget=rows * N // 2, low=2)
    scoring = SlotScoring(**{**scoring.__dict__, "capacities": np.full(rows, N)})
    drafted = [N, 5, N]
    uniforms = torch.zeros(STEPS, rows, 2 * BLOCK_SIZE + 1)
    if sampled:
        uniforms = torch.rand(
            STEPS, rows, 2 * BLOCK_SIZE + 1, generator=torch.Generator().manual_seed(9)
        )
    asked: list[int] = []

    def plan() -> SlotScoring:
        asked.append(1)
        return scoring

    runner, burst_rows = _admitted(pair, synthetic, graphs, rows, sampled)
    burst = runner.spec_steps(burst_rows, drafted, uniforms, scoring=plan)
    assert len(asked) == 1  # one scoring for the burst
    runner, single_rows = _admitted(pair, synthetic, graphs, rows, sampled)
    singles = []
    for i in range(STEPS):
        result = runner.step(single_rows, drafted, uniforms[i], scoring=plan)
        singles.append(result)
        _advance(single_rows, result)
    assert len(burst) == STEPS
    for a, b in zip(burst, singles, strict=True):
        assert a.on_device and b.on_device
        assert (a.new_tokens, a.accepted, a.spec_tokens) == (
            b.new_tokens,
            b.accepted,
            b.spec_tokens,
        )
        assert a.draft_confidence is not None and b.draft_confidence is not None
        assert [len(c) for c in a.draft_confidence] == drafted  # every drafted position
        for x, y in zip(a.draft_confidence, b.draft_confidence, strict=True):
            assert x == pytest.approx(y, abs=1e-5)
        ks = a.spec_tokens or []
        assert all(0 <= k <= d for k, d in zip(ks, drafted, strict=True))
        if not graphs:  # the eager path allocates the budget itself (graphs: its bucket)
            assert sum(ks) <= scoring.budget
    if not sampled:  # (this seed's sampled rows happen to get the same k every step)
        assert len({tuple(r.spec_tokens or []) for r in burst}) > 1


class BurstScoring(RandomDeviceScoring):
    """``RandomDeviceScoring`` that keeps which scoring each told step ran under."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.under: list[int] = []  # per told step: its scoring's index

    def scored_on_device(self, *args: Any) -> None:
        super().scored_on_device(*args)
        self.under.append(len(self.scorings) - 1)


@pytest.mark.parametrize("graphs", [False, True])
def test_device_allocated_bursts_keep_greedy_output_exact(
    agreeing_pair: Pair, graphs: bool
) -> None:
    """Random device scorings (random tables, budgets, a minimum k of 3) in bursts of 4: the
    target's own greedy tokens; bursts ran, several steps under one scoring; every step told
    to the planner with the confidence of every drafted position and the k each row
    verified (within what it drafted and the minimum), each request's history those k."""
    prompts = [random_prompt(4400 + i, PROMPT_LEN) for i in range(8)]
    expected = target_only_greedy(agreeing_pair[0], prompts, 24)
    options: dict[str, Any] = {"use_cuda_graphs": True, "verify_mode": "ragged"} if graphs else {}
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 6, 256, **options)
    engine = Engine(runner, 6, 256, spec_burst=STEPS)
    planner = BurstScoring(2)
    engine.planner = planner
    requests = [
        Request(f"r{i}", p, SamplingParams(max_new_tokens=24), lambda view: 0, {})
        for i, p in enumerate(prompts)
    ]
    run_all(engine, requests)
    assert [r.output_ids for r in requests] == expected
    drafting = engine.step_counts["drafting"]
    assert drafting.steps > drafting.round_trips  # some steps ran in bursts
    assert len(planner.told) > len(planner.scorings) > 3  # several steps per scoring
    told: dict[str, list[int]] = {}
    for (ids, confidence, ks, drafted), under in zip(planner.told, planner.under, strict=True):
        assert [len(c) for c in confidence] == drafted
        assert all(
            0 <= k <= d and (k == 0 or k >= min(3, d)) for k, d in zip(ks, drafted, strict=True)
        )
        if not graphs:
            assert sum(ks) <= planner.scorings[under].budget
        for request_id, k in zip(ids, ks, strict=True):
            told.setdefault(request_id, []).append(k)
    for r in requests:
        # a row that finished mid-burst was told its scratch steps too; then plain steps
        mine = told[r.request_id]
        n = min(len(mine), len(r.spec_tokens))
        assert r.spec_tokens[:n] == mine[:n] and not any(r.spec_tokens[len(mine) :])


def test_the_goodput_device_allocation_bursts_and_learns_from_every_step(
    agreeing_pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's step controller with ``slot_allocation: device`` in drafting bursts: the
    target's own greedy tokens within the policy's bounds; fewer scorings than device steps
    (one per burst), most made when the burst starts on the freshest confidence (the one
    made ahead during the previous burst read a burst older), and the allocator learns from
    every step that ran (``observed``)."""
    observed = counted_observations(monkeypatch)
    controller: StepController = goodput_controller(
        GoodputSpec(
            step_mode="slots", slots_min_batch=1, probe_probability=0.0, slot_allocation="device"
        )
    )
    prompts = [random_prompt(3000 + i, PROMPT_LEN) for i in range(12)]
    expected = target_only_greedy(agreeing_pair[0], prompts, 48)
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 6, 256)
    engine = Engine(runner, 6, 256, spec_burst=STEPS)
    engine.planner = controller
    requests = [
        greedy_request(f"r{i}", p, 48, controller.start(Task.MATH, 1.0, 7))
        for i, p in enumerate(prompts)
    ]
    run_all(engine, requests)
    engine.step()  # (nothing left: the last burst's scores are told by now)
    assert [r.output_ids for r in requests] == expected
    drafting = engine.step_counts["drafting"]
    assert drafting.steps > drafting.round_trips
    scorings = controller.scored_ahead + controller.scored_late
    assert len(observed) > scorings > 3
    assert controller.scored_late > controller.scored_ahead  # (single steps: the reverse)
    assert "(device)" in controller.last_reason
    assert_bounded(requests, 48)


def test_a_step_that_sets_up_a_device_allocation_shape_says_so(agreeing_pair: Pair) -> None:
    """``StepReport.first_use``: the engine calls during which the runner set up a device
    allocation's shape for the first time (the ragged static calls' allocation: a CUDA graph
    capture on a GPU, registered eagerly here) mark their reports, so the step-mode chooser
    leaves their time out; the calls after them, at shapes already set up, do not."""
    controller: StepController = goodput_controller(
        GoodputSpec(
            step_mode="slots", slots_min_batch=1, probe_probability=0.0, slot_allocation="device"
        )
    )
    options: dict[str, Any] = {"use_cuda_graphs": True, "verify_mode": "ragged"}
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 4, 256, **options)
    engine = Engine(runner, 4, 256, spec_burst=STEPS)
    engine.planner = controller
    for i in range(6):
        prompt = random_prompt(4000 + i, PROMPT_LEN)
        engine.add(greedy_request(f"r{i}", prompt, 40, controller.start(Task.MATH, 1.0, 7)))
    reports = []
    while engine.has_work:
        calls = runner.lazy_set_ups
        events = engine.step()
        drafted = [
            e.report
            for _, e in events
            if isinstance(e, TokenEvent) and e.report is not None and e.report.two_phase
        ]
        if drafted:
            grew = runner.lazy_set_ups > calls
            assert all(r.first_use == grew for r in drafted)
            reports.append(grew)
    # some calls set a shape up (each call's reports say whether it did), most did not
    assert 0 < sum(reports) <= runner.lazy_set_ups < len(reports)
    assert reports[-1] is False


def test_only_a_runner_that_allocates_in_bursts_gets_device_bursts() -> None:
    """The burst rule: a step the planner allocates on the device bursts like a one-phase
    step (the rows' room for their drafted k + 1 per step), unless the runner cannot allocate
    in bursts; a host allocation never bursts."""
    from types import SimpleNamespace

    class Planner:
        on_device = True

        def plan(self, *args: object) -> list[int]:
            return []

        def record(self, *args: object) -> None: ...

        def prepare(self, *args: object) -> None: ...

        def allocates(self) -> bool:
            return True

        def allocate(self, *args: object) -> list[int]:
            return []

        def allocates_on_device(self) -> bool:
            return self.on_device

        def slot_scoring(self, *args: object) -> None: ...

        def scored_on_device(self, *args: object) -> None: ...

    class Runner:
        allocates_in_bursts = True

        def spec_steps(self) -> None: ...

    engine = Engine.__new__(Engine)
    planner = Planner()
    engine.spec_burst, engine.plain_burst, engine.runner, engine.planner = 4, 1, Runner(), planner
    rows = [SimpleNamespace(num_remaining=400) for _ in range(4)]
    assert engine._burst_plan(rows, [N] * 4) == (4, [N] * 4)  # type: ignore[arg-type]
    planner.on_device = False  # a host allocation: one step
    assert engine._burst_plan(rows, [N] * 4) == (1, [N] * 4)  # type: ignore[arg-type]
    planner.on_device = True
    engine.runner.allocates_in_bursts = False  # type: ignore[attr-defined]
    assert engine._burst_plan(rows, [N] * 4) == (1, [N] * 4)  # type: ignore[arg-type]


def test_a_device_burst_that_raises_falls_back_to_single_steps(agreeing_pair: Pair) -> None:
    """A device-allocated burst that raises (here every one) costs speed, not tokens: the
    engine steps once instead, still allocated on the device, and the planner is told each
    of those steps."""
    prompts = [random_prompt(4500 + i, PROMPT_LEN) for i in range(4)]
    expected = target_only_greedy(agreeing_pair[0], prompts, 40)
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 4, 256)
    engine = Engine(runner, 4, 256, spec_burst=STEPS)
    planner = BurstScoring(3)
    engine.planner = planner
    tried: list[int] = []

    def broken(*args: Any, **options: Any) -> Any:
        tried.append(int(args[2].shape[0]))
        raise RuntimeError("the burst broke")

    runner.spec_steps = broken  # type: ignore[method-assign]
    requests = [
        Request(f"f{i}", p, SamplingParams(max_new_tokens=40), lambda view: 0, {})
        for i, p in enumerate(prompts)
    ]
    run_all(engine, requests)
    assert [r.output_ids for r in requests] == expected
    assert tried and all(n > 1 for n in tried)
    drafting = engine.step_counts["drafting"]
    assert drafting.steps == drafting.round_trips == len(planner.told) > 3
