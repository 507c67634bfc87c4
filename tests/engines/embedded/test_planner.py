"""The engine's step planner: one call per step with every row, answers clamped per row."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engines.embedded.events import RequestView, SpecController, StepReport
from tests.engines.embedded.conftest import (
    BLOCK_SIZE,
    fixed_k,
    greedy_request,
    make_engine,
    random_prompt,
    run_all,
)


class Recording:
    """Asks for k = 99 every step and keeps what it was shown."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int, list[int], int]]] = []
        self.recorded: list[list[tuple[int, int]]] = []
        self.prepared: list[int] = []

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        self.calls.append(
            [(v.request_id, v.batch_size, list(v.spec_tokens), v.max_spec_tokens) for v in views]
        )
        return [99] * len(views)

    def record(self, controllers: Sequence[SpecController], reports: Sequence[StepReport]) -> None:
        self.recorded.append([(r.spec_tokens, r.batch_size) for r in reports])

    def prepare(self, views: Sequence[RequestView], controllers: Sequence[SpecController]) -> None:
        self.prepared.append(len(views))


class Logging(Recording):
    """``Recording`` that also logs what it is told, in order: (kind, seconds or rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, float]] = []


def test_planner_is_asked_once_per_step_and_its_k_is_clamped_per_row(
    agreeing_pair: tuple[Path, Path],
) -> None:
    planner = Recording()
    engine = make_engine(agreeing_pair)
    engine.planner = planner
    short = greedy_request("short", random_prompt(1), 3, fixed_k(0))
    long = greedy_request("long", random_prompt(2), 40, fixed_k(0))
    run_all(engine, [short, long])
    assert all(len(step) == len({rid for rid, *_ in step}) for step in planner.calls)
    first = planner.calls[0]
    assert {rid for rid, *_ in first} == {"short", "long"} and first[0][1] == 2
    # "short" may emit 3 tokens: one from prefill, so its first step can verify at most 1.
    ceilings = {rid: ceiling for rid, _, _, ceiling in first}
    assert ceilings == {"short": 1, "long": BLOCK_SIZE - 1}
    # The k each step actually ran (after the clamp) is what the next step shows.
    assert short.spec_tokens[0] == 1 and long.spec_tokens[0] == BLOCK_SIZE - 1
    last_seen = {rid: ks for step in planner.calls for rid, _, ks, _ in step}
    assert last_seen["long"] == long.spec_tokens[: len(last_seen["long"])]
    assert len(long.spec_tokens) == len(long.accept_lengths)
    # Every planned step is reported back, one report per row that stepped, at the k it ran,
    # and the next step is prepared while each step runs.
    assert len(planner.recorded) == len(planner.calls)
    assert planner.prepared == [len(step) for step in planner.calls]
    assert planner.recorded[0] == [(1, 2), (BLOCK_SIZE - 1, 2)] or planner.recorded[0] == [
        (BLOCK_SIZE - 1, 2),
        (1, 2),
    ]


def test_a_failing_planner_turns_drafting_off_for_the_step(
    agreeing_pair: tuple[Path, Path],
) -> None:
    class Broken:
        def plan(self, views: Sequence[RequestView], controllers: object) -> list[int]:
            raise RuntimeError("boom")

        def record(self, controllers: object, reports: object) -> None:
            raise RuntimeError("boom too")

        def prepare(self, views: object, controllers: object) -> None:
            raise RuntimeError("boom three")

    engine = make_engine(agreeing_pair)
    engine.planner = Broken()
    request = greedy_request("r", random_prompt(3), 10, fixed_k(5))
    run_all(engine, [request])
    assert request.finish_reason == "length" and set(request.spec_tokens) == {0}


def test_a_planner_that_times_calls_is_told_each_calls_wall_time_before_its_steps(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """``TimesCalls``: after every decode call, before that call's steps reach ``record``,
    the call's wall time over its steps (at least the runner's time of each step)."""

    class Timing(Logging):
        def call_time(self, seconds_per_step: float) -> None:
            self.log.append(("call", seconds_per_step))

        def record(
            self, controllers: Sequence[SpecController], reports: Sequence[StepReport]
        ) -> None:
            super().record(controllers, reports)
            self.log.append(("record", max(r.step_time_s for r in reports)))

    planner = Timing()
    engine = make_engine(agreeing_pair)
    engine.planner = planner
    run_all(engine, [greedy_request("a", random_prompt(3), 12, fixed_k(0))])
    calls = [seconds for kind, seconds in planner.log if kind == "call"]
    assert len(calls) == len(planner.calls) == len(planner.recorded)
    assert planner.log[0][0] == "call"
    for (kind, told), (next_kind, step_s) in zip(planner.log[::2], planner.log[1::2], strict=True):
        assert (kind, next_kind) == ("call", "record")
        assert told >= step_s > 0


def test_a_planner_that_times_prefills_is_told_each_admissions_prefill_before_its_plan(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """``TimesPrefills``: when an engine call admits requests, their prefill's seconds reach
    the planner before that call's ``plan`` (the auto mode's chooser leaves them out of the
    steps it times); a call that admits nothing tells nothing."""

    class Timing(Logging):
        def prefill_time(self, seconds: float) -> None:
            self.log.append(("prefill", seconds))

        def plan(
            self, views: Sequence[RequestView], controllers: Sequence[SpecController]
        ) -> list[int]:
            self.log.append(("plan", float(len(views))))
            return super().plan(views, controllers)

    planner = Timing()
    engine = make_engine(agreeing_pair)
    engine.planner = planner
    engine.add(greedy_request("a", random_prompt(3), 6, fixed_k(0)))
    engine.step()  # admits a, then plans its first decode step
    assert [kind for kind, _ in planner.log] == ["prefill", "plan"]
    engine.add(greedy_request("b", random_prompt(4), 6, fixed_k(0)))
    while engine.has_work:
        engine.step()
    kinds = [kind for kind, _ in planner.log]
    assert kinds[:2] == ["prefill", "plan"]
    assert kinds.count("prefill") == 2  # one per admitting call, none for the others
    second = kinds.index("prefill", 1)
    assert kinds[second + 1] == "plan"
    assert all(seconds > 0 for kind, seconds in planner.log if kind == "prefill")
