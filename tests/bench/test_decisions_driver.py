"""The GPU-decisions harness's driver (bench/decisions/driver.py) tallies a burst
(``Engine.plain_burst`` / ``spec_burst``: several steps in one ``engine.step()`` call) as its
steps: one timeline entry per step with its rows, the call's time split between them, and the
phase's tokens, row-steps and verified tokens unchanged against an engine stepping once per
call."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from bench.decisions.driver import run_policy
from bench.decisions.policies import Built
from bench.decisions.workload import Job, Phase
from engines.embedded.engine import Engine
from engines.embedded.loader import load_runner
from policies.types import Task
from tests.tinymodels import write_tiny_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_pair(tmp_path_factory.mktemp("driver"), block_size=8, seed=0)


def _tally(  # type: ignore[type-arg]
    pair: tuple[Path, Path],
    burst: int,
    k: int,
    spec: int = 1,
    unseen: bool = False,
    lengths: tuple[int, ...] = tuple(9 + 4 * i for i in range(6)),
) -> dict:
    runner = load_runner(pair[0], pair[1], torch.device("cpu"), 4, 128)
    engine = Engine(runner, 4, 128, plain_burst=burst, spec_burst=spec)
    jobs = [Job(f"j{i}", Task.CHAT, tuple(range(3 + i, 13 + i)), n) for i, n in enumerate(lengths)]
    phase = Phase("p", 3, len(jobs), {Task.CHAT: 1.0})
    built = Built(None, lambda job: lambda view: k, lambda: (0.0, 0))
    (tally,) = run_policy(engine, built, [phase], [jobs], 8, unseen_ends=unseen)
    assert not engine.has_work  # every request ended (unseen ends: aborted at their length)
    return {
        "tokens": tally.tokens,
        "row_steps": len(tally.row_ks),
        "verify_tokens": tally.verify_tokens,
        "steps": len(tally.step_s),
        "timeline": tally.timeline,
        "step_s": tally.step_s,
        "elapsed_s": tally.elapsed_s,
    }


@pytest.mark.parametrize("k", [0, 3])
def test_a_burst_is_tallied_as_its_steps(pair: tuple[Path, Path], k: int) -> None:
    single, burst = _tally(pair, 1, k), _tally(pair, 4, k)
    for key in ("tokens", "row_steps", "verify_tokens"):
        assert single[key] == burst[key], key
    if k:  # drafting rows never burst: the same steps
        assert burst["steps"] == single["steps"]
        return
    # Fewer calls, the same steps; each step's rows and tokens are one row's one token.
    assert burst["steps"] == single["steps"]
    decode = [step for step in burst["timeline"] if step[0] and not step[2]]
    assert decode and all(step[7] == step[0] == step[6] for step in decode)
    # A call that admitted marks each of its steps so: their shares of its time hold the
    # prefill's (steps of one call share their time exactly).
    pairs = list(itertools.pairwise(burst["timeline"]))
    same_call = [(a, b) for a, b in pairs if a[3] == b[3]]
    assert any(a[2] for a, _ in same_call)
    assert all(a[2] == b[2] for a, b in same_call)
    assert sum(step[7] for step in burst["timeline"]) == burst["tokens"]
    # Runs of equal times: a burst's steps share its call's time, not each the whole of it.
    times = burst["step_s"]
    assert sum(times) <= burst["elapsed_s"]
    assert any(
        times[i] == times[i + 1] == times[i + 2] == times[i + 3] for i in range(len(times) - 3)
    )


def test_a_drafting_burst_is_tallied_as_its_steps(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drafting bursts (k = 3, ``spec_burst`` 4) that cut no row's k: the same tokens,
    row-steps, verified tokens and steps as one step a call, each burst's steps sharing its
    call's time. With the engine's cuts (rows near their end drafting fewer in a burst) the
    same tokens from fewer verified ones."""
    single, cut = _tally(pair, 1, 3), _tally(pair, 1, 3, spec=4)
    assert cut["tokens"] == single["tokens"] and cut["verify_tokens"] < single["verify_tokens"]
    monkeypatch.setattr(Engine, "burst_cut_share", 0.0)
    burst = _tally(pair, 1, 3, spec=4)
    for key in ("tokens", "row_steps", "verify_tokens", "steps"):
        assert single[key] == burst[key], key
    times = burst["step_s"]
    assert any(times[i] == times[i + 1] == times[i + 2] for i in range(len(times) - 2))
    assert not any(
        single["step_s"][i] == single["step_s"][i + 1] == single["step_s"][i + 2]
        for i in range(len(single["step_s"]) - 2)
    )


def test_unseen_ends_count_each_jobs_tokens_and_bursts_run_past_them(
    pair: tuple[Path, Path],
) -> None:
    """``unseen_ends``: requests end at their job's length as at an end-of-sequence token the
    engine cannot foresee. Every setting counts the same tokens (each job's length and its
    prefill token); drafting bursts of 4 then run steps past rows' ends (more row-steps and
    verified tokens than the same bursts with ends the engine sees, whose room rule keeps
    them inside), while single steps never step a row past its end."""
    lengths = (10, 15, 19, 22, 27, 30)  # (not one more than a multiple of the bursts' 4 steps)
    seen = _tally(pair, 1, 3, spec=4, lengths=lengths)
    single = _tally(pair, 1, 3, unseen=True, lengths=lengths)
    unseen = _tally(pair, 1, 3, spec=4, unseen=True, lengths=lengths)
    assert seen["tokens"] == single["tokens"] == unseen["tokens"] == sum(lengths)
    assert unseen["row_steps"] > seen["row_steps"]
    assert unseen["verify_tokens"] > seen["verify_tokens"]
    assert unseen["row_steps"] > single["row_steps"]
    assert sum(step[7] for step in unseen["timeline"]) == unseen["tokens"]


def test_reasons_are_tallied_per_call_whether_parsed_or_held() -> None:
    """A decision held over several calls hands the tally the same string object (parsed once,
    then counted from the parse); an equal string built anew, or another reason, is parsed."""
    from bench.decisions.driver import PhaseTally

    tally = PhaseTally()
    held = "batch[best] B=64 k=7 1.20x plain"
    for _ in range(3):
        tally.add_reason(held)
    tally.add_reason("".join(["batch[best] B=8 k=7 ", "1.40x plain"]))  # equal key, a new object
    tally.add_reason("batch[hold] B=64 k=0 1.00x plain")
    tally.add_reason(held)
    tally.add_reason("")
    reasons = tally.top_reasons()
    assert reasons["batch[best] k=7"]["calls"] == 5
    assert reasons["batch[best] k=7"]["expected_gain"] == pytest.approx((4 * 1.2 + 1.4) / 5)
    assert reasons["batch[hold] k=0"] == {"calls": 1, "expected_gain": 1.0}
