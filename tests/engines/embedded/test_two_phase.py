"""Two-phase steps (issue 16): every row drafts, the draft's confidence comes to the host, a
planner allocates each row's k, the step verifies those. Greedy output stays exactly the
target's own, whatever the allocation; a planner that raises costs speed, never tokens."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from bench.decisions.exactness import RandomAllocation
from engines.embedded.engine import Engine
from engines.embedded.request import Request
from engines.step_controller import StepController
from policies.costmodel import CostTable
from policies.model import GoodputSpec, PolicySpec
from policies.online import OnlineModels
from policies.registry import build_policy
from policies.slot_allocator import SlotAllocator
from policies.types import Task
from tests.engines.embedded.conftest import greedy_request, make_engine, random_prompt, run_all
from tests.engines.embedded.test_lossless import PROMPT_LEN, target_only_greedy

NUM_PROMPTS = 12
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return [random_prompt(3000 + i, PROMPT_LEN) for i in range(NUM_PROMPTS)]


@pytest.fixture(scope="module")
def expected(agreeing_pair: tuple[Path, Path], prompts: list[list[int]]) -> list[list[int]]:
    return target_only_greedy(agreeing_pair[0], prompts, NEW_TOKENS)


def run(engine: Engine, prompts: list[list[int]]) -> list[Request]:
    requests = [
        greedy_request(f"r{i}", p, NEW_TOKENS, lambda view: 0) for i, p in enumerate(prompts)
    ]
    for request in requests:
        engine.add(request)
    while engine.has_work:
        engine.step()
    return requests


def assert_bounded(requests: list[Request], new_tokens: int = NEW_TOKENS) -> None:
    """Every step's k in {0} U [4, 7], or all a request's last tokens allow."""
    for r in requests:
        emitted = 1  # the prefill's token
        for k, length in zip(r.spec_tokens, r.accept_lengths, strict=True):
            capacity = min(7, new_tokens - emitted - 1)
            assert k == 0 or min(4, capacity) <= k <= capacity, (r.spec_tokens, k, capacity)
            emitted += length


def counted_observations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each ``SlotAllocator.observed`` call's row count, in order (it still learns)."""
    observed: list[int] = []
    original = SlotAllocator.observed

    def counted(self: SlotAllocator, scoring: Any, confidence: Any, *outcome: Any) -> None:
        observed.append(len(confidence))
        original(self, scoring, confidence, *outcome)

    monkeypatch.setattr(SlotAllocator, "observed", counted)
    return observed


def goodput_controller(goodput: GoodputSpec) -> StepController:
    """The daemon's step controller running the goodput policy ``goodput`` on a small cost
    table (block 8); a policy that raises fails the test."""
    spec = PolicySpec(kind="goodput", goodput=goodput)
    table = CostTable(
        batch_sizes=(1, 8),
        tokens_per_request=(1, 8),
        step_time_s=((5e-3, 6e-3), (6e-3, 9e-3)),
    )

    class Source:
        version = 1
        models = OnlineModels(goodput, block_size=8, cost_table=table)
        policy = build_policy(spec)

        def __init__(self) -> None:
            self.spec = spec

        def active(self) -> Source:
            return self

        def acceptance(self, task: Task) -> dict[str, object]:
            return {}

        def policy_failed(self) -> None:
            raise AssertionError("the allocator raised")

    # (the engines these tests drive verify each row at its own width: the eager CPU path)
    return StepController(Source(), 8, random.Random(0), ragged=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("fail", [False, True])
def test_any_allocation_keeps_greedy_output_exact(
    agreeing_pair: tuple[Path, Path],
    prompts: list[list[int]],
    expected: list[list[int]],
    fail: bool,
) -> None:
    engine = make_engine(agreeing_pair, max_batch_size=6)
    planner = RandomAllocation(0, fail)
    engine.planner = planner
    requests = run(engine, prompts)
    assert [r.output_ids for r in requests] == expected
    if not fail:
        assert planner.allocated and any(0 in ks for ks in planner.allocated)
        # every request's history holds the k it verified, not the k it drafted
        verified = sorted(k for r in requests for k in r.spec_tokens)
        assert verified[0] == 0 and len(set(verified)) > 3


def test_the_goodput_slots_mode_drives_the_engine_losslessly(
    agreeing_pair: tuple[Path, Path],
    prompts: list[list[int]],
    expected: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """... and the allocation's confidence-free part runs before the confidence's copy, once
    per two-phase step (``prepare_allocation``), so ``allocate`` only finishes it."""
    calls = {"prepare_allocation": 0, "prepare_step": 0}
    original = SlotAllocator.prepare_step

    def prepare_step(self: SlotAllocator, *args: Any, **kwargs: Any) -> Any:
        calls["prepare_step"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SlotAllocator, "prepare_step", prepare_step)
    goodput = GoodputSpec(
        step_mode="slots", slots_min_batch=1, probe_probability=0.0, slot_allocation="host"
    )
    controller = goodput_controller(goodput)
    prepare_allocation = controller.prepare_allocation

    def counted(*args: Any) -> None:
        calls["prepare_allocation"] += 1
        prepare_allocation(*args)

    monkeypatch.setattr(controller, "prepare_allocation", counted)
    engine = make_engine(agreeing_pair, max_batch_size=6)
    engine.planner = controller
    requests = [
        greedy_request(f"r{i}", p, NEW_TOKENS, controller.start(Task.MATH, 1.0, 7))
        for i, p in enumerate(prompts)
    ]
    for request in requests:
        engine.add(request)
    while engine.has_work:
        engine.step()
    assert [r.output_ids for r in requests] == expected
    assert controller.last_reason.startswith("allocator:")
    assert calls["prepare_allocation"] > 0
    assert calls["prepare_step"] == calls["prepare_allocation"]
    assert_bounded(requests)


def test_the_goodput_slots_mode_allocates_on_the_device_losslessly(
    agreeing_pair: tuple[Path, Path],
    prompts: list[list[int]],
    expected: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``slot_allocation: device``: every two-phase step is scored on the device (the host
    never allocates), most of them while the previous step ran, each row's next budget is
    priced on an earlier step's confidence, and the allocator learns from every step that ran
    (``observed``)."""
    observed = counted_observations(monkeypatch)
    goodput = GoodputSpec(
        step_mode="slots", slots_min_batch=1, probe_probability=0.0, slot_allocation="device"
    )
    controller = goodput_controller(goodput)

    def host_allocation(*args: Any) -> list[int]:
        raise AssertionError("a device-allocated step never allocates on the host")

    monkeypatch.setattr(controller, "allocate", host_allocation)
    engine = make_engine(agreeing_pair, max_batch_size=6)
    engine.planner = controller
    starts = [controller.start(Task.MATH, 1.0, 7) for _ in prompts]
    requests = [
        greedy_request(f"r{i}", p, NEW_TOKENS, start)
        for i, (p, start) in enumerate(zip(prompts, starts, strict=True))
    ]
    for request in requests:
        engine.add(request)
    while engine.has_work:
        engine.step()
    assert [r.output_ids for r in requests] == expected
    assert controller.last_reason.startswith("allocator:") and "(device)" in controller.last_reason
    assert len(observed) == controller.scored_ahead + controller.scored_late > 5
    assert controller.scored_ahead > controller.scored_late  # rows stay: scored ahead
    allocator = controller._allocator
    assert allocator is not None and allocator[1]._labels.sum() > 0  # it learnt
    assert all(s.last_confidence is not None for s in starts)  # each priced its next budget
    assert_bounded(requests)


def test_device_allocation_needs_an_engine_whose_rows_verify_at_their_own_widths(
    agreeing_pair: tuple[Path, Path],
    prompts: list[list[int]],
    expected: list[list[int]],
) -> None:
    """On an engine that pads a step's rows (``ragged`` False) a device allocation would
    verify every drafted slot: two-phase steps of ``slot_allocation: device`` allocate on the
    host there."""
    goodput = GoodputSpec(
        step_mode="slots", slots_min_batch=1, probe_probability=0.0, slot_allocation="device"
    )
    controller = goodput_controller(goodput)
    controller.ragged = False
    engine = make_engine(agreeing_pair, max_batch_size=6)
    engine.planner = controller
    requests = [
        greedy_request(f"p{i}", p, NEW_TOKENS, controller.start(Task.MATH, 1.0, 7))
        for i, p in enumerate(prompts)
    ]
    run_all(engine, requests)
    assert [r.output_ids for r in requests] == expected
    assert controller.scored_ahead == controller.scored_late == 0
    assert controller.last_reason.startswith("allocator:") and "(device)" not in (
        controller.last_reason
    )


def test_the_goodput_policys_one_phase_steps_burst_losslessly_and_report_every_step(
    agreeing_pair: tuple[Path, Path],
    prompts: list[list[int]],
    expected: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The daemon's step controller on one-phase steps in drafting bursts (``spec_burst``, 4 on
    CUDA by default): the target's own greedy tokens, k within the policy's bounds, bursts of
    several steps, and every step of every burst told to the planner (one report per row per
    decode step, as single steps give)."""
    controller = goodput_controller(GoodputSpec(step_mode="shared", probe_probability=0.0))
    told: list[int] = []
    record = controller.record

    def counted(controllers: Any, reports: Any) -> None:
        told.append(len(reports))
        record(controllers, reports)

    monkeypatch.setattr(controller, "record", counted)
    engine = make_engine(agreeing_pair, max_batch_size=6)
    engine.spec_burst, engine.planner = 4, controller
    requests = [
        greedy_request(f"r{i}", p, NEW_TOKENS, controller.start(Task.MATH, 1.0, 7))
        for i, p in enumerate(prompts)
    ]
    run_all(engine, requests)
    assert [r.output_ids for r in requests] == expected
    drafting = engine.step_counts["drafting"]
    assert drafting.steps > drafting.round_trips  # some steps ran in bursts
    engine.step()  # (nothing left: the last step's reports go to the planner now or here)
    assert sum(told) == sum(len(r.spec_tokens) for r in requests)
    assert_bounded(requests)
