"""Synthetic acceptance (benchmark only): seeded, batch-independent draws with the profile's
mean, conversions that round-trip, and an engine that emits accepted drafts + the target's
token while every forward still runs."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import RequestView, SamplingParams, StepReport, TokenEvent
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from engines.embedded.synthetic import SYNTHETIC_WARNING, SyntheticAcceptance, assemble_rows
from engines.embedded.synthetic_profiles import PROFILES_PATH, load_profile_set
from engines.embedded.synthetic_rates import (
    TaskProfile,
    conditional_from_unconditional,
    expected_accept_length,
    min_variance_rates,
    rates_from_accept_length,
)
from tests.engines.embedded.conftest import BLOCK_SIZE, fixed_k, make_engine, random_prompt

transformers = pytest.importorskip("transformers")

Pair = tuple[Path, Path]
N = BLOCK_SIZE - 1  # drafted positions of the tiny pair
SPREADS = {"request_spread": 0.5, "drift_spread": 0.8, "drift_corr": 0.8}


def tiny_profiles(seed: int = 0) -> SyntheticAcceptance:
    return SyntheticAcceptance(
        {
            "math": TaskProfile.from_accept_length(4.5, N, decay=0.9, **SPREADS),
            "chat": TaskProfile.from_accept_length(2.5, N, decay=0.5, **SPREADS),
        },
        seed=seed,
        name="tiny",
    )


# -- draws -------------------------------------------------------------------------------------


def test_draws_are_seeded_and_reproducible() -> None:
    keys = [f"r{i}" for i in range(32)]
    steps = list(range(32))
    first = tiny_profiles(seed=3).accept_runs(["math"] * 32, keys, steps, N)
    again = tiny_profiles(seed=3).accept_runs(["math"] * 32, keys, steps, N)
    other = tiny_profiles(seed=4).accept_runs(["math"] * 32, keys, steps, N)
    assert first.tolist() == again.tolist()
    assert first.tolist() != other.tolist()
    assert 0 <= first.min() and first.max() <= N


def test_draws_do_not_depend_on_the_batch() -> None:
    synthetic = tiny_profiles()
    for step in range(50):
        alone = synthetic.accept_run("math", "req-7", step, N)
        batch = synthetic.accept_runs(
            ["chat", "math", "math", "chat"], ["a", "req-7", "b", "c"], [3, step, 90, 0], N
        )
        assert batch[1] == alone
        reordered = synthetic.accept_runs(["math", "chat"], ["req-7", "x"], [step, step], N)
        assert reordered[0] == alone


def test_one_draw_answers_every_k() -> None:
    """Drafting k <= k_max accepts min(k, run): the same uniforms whatever k is."""
    synthetic = tiny_profiles()
    keys, steps = [f"r{i}" for i in range(200)], [i % 17 for i in range(200)]
    full = synthetic.accept_runs(["math"] * 200, keys, steps, N)
    for k in range(N + 1):
        assert (
            synthetic.accept_runs(["math"] * 200, keys, steps, k).tolist()
            == np.minimum(full, k).tolist()
        )


def test_unknown_task_and_k_are_refused() -> None:
    synthetic = tiny_profiles()
    with pytest.raises(ValueError, match=r"task 'poetry'.*'chat', 'math'"):
        synthetic.accept_run("poetry", "r", 0, 3)
    with pytest.raises(ValueError, match=f"k_max=8: must be in \\[0, {N}\\]"):
        synthetic.accept_run("math", "r", 0, 8)


@pytest.mark.parametrize("name", ["realistic", "qwen3-8b-published", "sim-parametric"])
def test_empirical_mean_matches_profile(name: str) -> None:
    """Mean accept length over 800 requests x 40 steps within 4 standard errors of the profile's
    expectation (per-request means are independent; fixed seeds, so no flakes)."""
    synthetic = load_profile_set(name, seed=11)
    requests, steps = 800, 40
    keys = [f"req-{i}" for i in range(requests)]
    for task, profile in synthetic.profiles.items():
        runs = np.stack(
            [
                synthetic.accept_runs([task] * requests, keys, [t] * requests, 15)
                for t in range(steps)
            ],
            axis=1,
        )
        for k in (3, 7, 15):
            lengths = np.minimum(runs, k) + 1.0
            per_request = lengths.mean(axis=1)
            error = per_request.std(ddof=1) / math.sqrt(requests)
            expected = profile.expected_accept_length(k)
            assert abs(per_request.mean() - expected) < 4 * error + 1e-9, (task, k)


def test_request_offset_and_drift_have_their_spreads() -> None:
    profile = TaskProfile((0.5,) * N, request_spread=0.7, drift_spread=0.0)
    synthetic = SyntheticAcceptance({"math": profile}, seed=5)
    offsets = np.array(
        [[synthetic.step_offset("math", f"k{i}", t) for t in (0, 9)] for i in range(2000)]
    )
    assert offsets[:, 0].tolist() == offsets[:, 1].tolist()  # constant over a request's steps
    assert abs(offsets[:, 0].std() - 0.7) < 0.05

    drifting = TaskProfile((0.5,) * N, drift_spread=0.9, drift_corr=0.8)
    synthetic = SyntheticAcceptance({"math": drifting}, seed=5)
    series = np.array(
        [[synthetic.step_offset("math", f"k{i}", t) for t in range(30)] for i in range(300)]
    )
    assert abs(series.std() - 0.9) < 0.05
    lag1 = np.corrcoef(series[:, :-1].ravel(), series[:, 1:].ravel())[0, 1]
    assert abs(lag1 - 0.8) < 0.05


# -- conversions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "n", "expected"),
    [
        (2.6, 3, [1.0, 0.6, 0.0]),
        (1.0, 3, [0.0, 0.0, 0.0]),
        (4.0, 3, [1.0, 1.0, 1.0]),
        (3.5, 4, [1.0, 1.0, 0.5, 0.0]),
    ],
)
def test_vllm_min_variance_schedule(length: float, n: int, expected: list[float]) -> None:
    """vLLM's cases (tests/v1/spec_decode: test_acceptance_length_to_rates), then back."""
    rates = min_variance_rates(length, n)
    assert rates == pytest.approx(expected)
    assert expected_accept_length(conditional_from_unconditional(rates), n) == pytest.approx(length)


def test_conditional_from_unconditional() -> None:
    assert conditional_from_unconditional([0.9, 0.5, 0.2]) == pytest.approx([0.9, 0.5 / 0.9, 0.4])
    assert conditional_from_unconditional([1.0, 0.6, 0.0, 0.0]) == pytest.approx([1.0, 0.6, 0, 0])


@pytest.mark.parametrize("length", [1.3, 2.9, 4.0, 6.9, 8.24, 12.0])
@pytest.mark.parametrize("decay", [0.0, 0.93])
@pytest.mark.parametrize("spread", [0.0, 0.94])
def test_accept_length_round_trips(length: float, decay: float, spread: float) -> None:
    rates = rates_from_accept_length(length, 15, decay=decay)
    assert expected_accept_length(rates, 15) == pytest.approx(length, abs=1e-6)
    if decay == 0.0:  # llama.cpp's conversion: one c with c + ... + c^15 = length - 1
        c = rates[0]
        assert rates == pytest.approx([c] * 15)
        assert sum(c**j for j in range(1, 16)) == pytest.approx(length - 1, abs=1e-6)
    profile = TaskProfile.from_accept_length(
        length, 15, decay=decay, request_spread=spread, drift_spread=spread / 2, drift_corr=0.5
    )
    assert profile.expected_accept_length(15) == pytest.approx(length, abs=1e-6)


def test_unconditional_profile_is_vllms_rates() -> None:
    profile = TaskProfile.from_unconditional_rates([0.9, 0.5, 0.2])
    assert profile.expected_accept_length(3) == pytest.approx(1 + 0.9 + 0.5 + 0.2)
    with pytest.raises(ValueError, match="non-increasing"):
        TaskProfile.from_unconditional_rates([0.5, 0.9])


# -- profile file ------------------------------------------------------------------------------


def test_profile_file_sets_and_calibration() -> None:
    realistic = load_profile_set()  # the file's default set
    assert realistic.name == "realistic"
    means = {t: p.expected_accept_length(15) for t, p in realistic.profiles.items()}
    assert means == pytest.approx({"math": 6.9, "code": 5.6, "chat": 4.0}, abs=1e-6)
    assert SYNTHETIC_WARNING in realistic.warning and "realistic" in realistic.warning
    assert realistic.SYNTHETIC_WARNING == SYNTHETIC_WARNING
    described = realistic.describe()
    assert described["mode"] == "synthetic_acceptance" and described["warning"] == realistic.warning
    published = load_profile_set("qwen3-4b-published").profiles
    assert published["chat"].expected_accept_length(15) == pytest.approx(3.43, abs=1e-6)


def test_profile_file_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="set 'nope'"):
        load_profile_set("nope")
    text = PROFILES_PATH.read_text().replace("decay: 0.93, sources", "decya: 0.93, sources", 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=r"sets\.realistic\.tasks\.math\.decya.*line"):
        load_profile_set(path=bad)


def test_assemble_rows() -> None:
    # widest 3: drafts [11, 12, 13], target tokens at positions 0..3 [20, 21, 22, 23]
    row = [11, 12, 13, 20, 21, 22, 23]
    accepted, tokens = assemble_rows([row, row, row], [3, 2, 0], [1, 5, 4], 3)
    assert accepted == [[True, False, False], [True, True], []]
    assert tokens == [[11, 21], [11, 12, 22], [20]]


# -- the engine in synthetic mode ---------------------------------------------------------------


def synthetic_engine(pair: Pair, synthetic: SyntheticAcceptance) -> Engine:
    runner = load_runner(pair[0], pair[1], torch.device("cpu"), 8, 256, synthetic=synthetic)
    return Engine(runner, 8, 256)


def random_k(seed: int) -> Callable[[RequestView], int]:
    rng = random.Random(seed)
    return lambda view: rng.randint(0, N)


def run(engine: Engine, requests: list[Request]) -> dict[str, list[StepReport]]:
    reports: dict[str, list[StepReport]] = {r.request_id: [] for r in requests}
    for request in requests:
        engine.add(request)
    while engine.has_work:
        for request, event in engine.step():
            assert isinstance(event, TokenEvent), event
            if event.report is not None:
                reports[request.request_id].append(event.report)
    return reports


def request(name: str, task: str, prompt_seed: int, new_tokens: int = 40, **params: Any) -> Request:
    context = {"task": task, "synthetic_key": f"key-{name}"}
    return Request(
        name,
        random_prompt(prompt_seed),
        SamplingParams(max_new_tokens=new_tokens, **params),
        random_k(prompt_seed),
        context,
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_accepts_the_drawn_run(
    tiny_pair: Pair, temperature: float, caplog: pytest.LogCaptureFixture
) -> None:
    """accept_length = min(k, drawn run) + 1 at the step index the controller saw; greedy: the
    bonus is the target's argmax after the emitted prefix, and drafts the target would not
    have chosen get emitted (the plain pair's draft rarely agrees with its target)."""
    synthetic = tiny_profiles(seed=1)
    with caplog.at_level("WARNING"):
        engine = synthetic_engine(tiny_pair, synthetic)
    assert synthetic.warning in caplog.text
    requests = [
        request(f"r{i}", ("math", "chat")[i % 2], 50 + i, temperature=temperature, seed=i)
        for i in range(6)
    ]
    reports = run(engine, requests)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32)
    num_disagreeing_drafts = 0
    for r in requests:
        task, key = synthetic.identity(r.request_id, r.context)
        assert (task, key) == (r.context["task"], f"key-{r.request_id}")
        position = 0  # output index of the step's input token (the prefill token first)
        with torch.no_grad():
            argmax = model(torch.tensor([r.prompt_ids + r.output_ids])).logits[0].argmax(-1)
        start = len(r.prompt_ids)
        for step, report in enumerate(reports[r.request_id]):
            run_length = synthetic.accept_run(task, key, step, N)
            assert report.accept_length == min(report.spec_tokens, run_length) + 1
            assert sum(report.accepted) == report.accept_length - 1
            bonus = position + report.accept_length  # output index of the step's last token
            if temperature == 0.0 and bonus < len(r.output_ids):
                assert int(argmax[start + bonus - 1]) == r.output_ids[bonus]
                drafted = r.output_ids[position + 1 : bonus]
                chosen = argmax[start + position : start + bonus - 1].tolist()
                num_disagreeing_drafts += sum(a != b for a, b in zip(drafted, chosen, strict=True))
            position = bonus
    if temperature == 0.0:
        assert num_disagreeing_drafts > 10


def test_engine_draws_do_not_depend_on_the_batch(tiny_pair: Pair) -> None:
    synthetic = tiny_profiles(seed=2)
    alone = synthetic_engine(tiny_pair, synthetic)
    solo = request("target", "math", 7)
    run(alone, [solo])
    batched = synthetic_engine(tiny_pair, synthetic)
    others = [request(f"o{i}", "chat", 20 + i, new_tokens=15 + 9 * i) for i in range(3)]
    again = request("target", "math", 7)
    reports = run(batched, [others[0], again, *others[1:]])
    assert again.output_ids == solo.output_ids
    assert again.accept_lengths == solo.accept_lengths
    assert len(reports["target"]) == len(solo.accept_lengths)


def test_engine_with_rates_zero_and_one(tiny_pair: Pair) -> None:
    """Rates 0: nothing accepted, so the output is target-only greedy (k = 0's output); rates 1:
    every drafted token accepted."""
    prompt = random_prompt(99)
    plain = make_engine(tiny_pair)
    reference = Request("ref", prompt, SamplingParams(max_new_tokens=30), fixed_k(0), {})
    run(plain, [reference])
    never = SyntheticAcceptance({"math": TaskProfile((0.0,) * N)})
    rejected = Request("a", prompt, SamplingParams(max_new_tokens=30), fixed_k(N), {"task": "math"})
    run(synthetic_engine(tiny_pair, never), [rejected])
    assert rejected.output_ids == reference.output_ids
    assert set(rejected.accept_lengths) == {1}
    always = SyntheticAcceptance({"math": TaskProfile((1.0,) * N)})
    accepted = Request("b", prompt, SamplingParams(max_new_tokens=30), fixed_k(5), {"task": "math"})
    reports = run(synthetic_engine(tiny_pair, always), [accepted])
    assert all(rep.accept_length == rep.spec_tokens + 1 for rep in reports["b"])
    assert reports["b"][0].accept_length == 6


def test_missing_task_fails_only_that_request(tiny_pair: Pair) -> None:
    engine = synthetic_engine(tiny_pair, tiny_profiles())
    good = request("good", "math", 3, new_tokens=10)
    bad = Request("bad", random_prompt(4), SamplingParams(max_new_tokens=10), fixed_k(3), {})
    engine.add(good)
    engine.add(bad)
    failures = []
    while engine.has_work:
        failures += [e for _, e in engine.step() if not isinstance(e, TokenEvent)]
    assert [f.request_id for f in failures] == ["bad"]
    assert "task ''" in str(failures[0])
    assert good.finish_reason == "length"


def test_profile_must_cover_the_block(tiny_pair: Pair) -> None:
    short = SyntheticAcceptance({"math": TaskProfile((0.5,) * 3)})
    with pytest.raises(ValueError, match="covers k <= 3"):
        synthetic_engine(tiny_pair, short)


def test_controller_sees_the_step_the_draw_uses(tiny_pair: Pair) -> None:
    """A clairvoyant controller reads the run ahead and drafts exactly that many."""
    synthetic = tiny_profiles(seed=9)

    def oracle(view: RequestView) -> int:
        task, key = synthetic.identity(view.request_id, view.context)
        return synthetic.accept_run(task, key, view.step_index, N)

    engine = synthetic_engine(tiny_pair, synthetic)
    r = Request("o", random_prompt(5), SamplingParams(max_new_tokens=60), oracle, {"task": "math"})
    reports = run(engine, [r])
    assert all(all(rep.accepted) for rep in reports["o"])  # nothing drafted is ever rejected
