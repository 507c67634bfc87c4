"""The GPU benchmark's exactness check (bench/decisions/exactness.py) on the CPU with the demo
pair: every setting matches k = 0, and a divergence is reported at the right token with the
reference's margins (a divergence is made by hand: fp32 on the CPU has none)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from bench.decisions import exactness
from engines.embedded.engine import Engine
from engines.embedded.loader import load_runner

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"
PROMPTS = [
    "Natalia sold clips to 48 of her friends in April. How many clips did she sell?",
    "Write a python function to reverse a list.",
    "Tell me about your favourite city.",
    "What is 17 times 23?",
    "def fib(n):",
    "Compose a short poem about the sea.",
]


@pytest.fixture(scope="module")
def setup() -> tuple[Engine, list[list[int]]]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runner = load_runner(DEMO / "target", DEMO / "draft", torch.device("cpu"), 8, 256)
    finally:
        torch.set_num_threads(previous)
    tokenizer = transformers.AutoTokenizer.from_pretrained(DEMO / "target")
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        for p in PROMPTS
    ]
    return Engine(runner, 8, 256), prompts


def test_every_setting_matches_plain_decoding(setup: tuple[Engine, list[list[int]]]) -> None:
    engine, prompts = setup
    result = exactness.check(engine, prompts, DEMO / "target", max_new_tokens=40)
    assert [s.name for s in exactness.settings(engine.block_size)] == ["k4", "k7", "random-k"]
    for name in ("k4", "k7", "random-k", "two-phase-random"):
        assert result[name]["identical"] == len(prompts), result[name]
        assert result[name]["diverged_at_clear_margin"] == 0
    assert engine.planner is None  # the two-phase setting's planner was taken off again


def test_a_divergence_is_reported_with_the_reference_margins(
    setup: tuple[Engine, list[list[int]]],
) -> None:
    engine, prompts = setup
    plain = exactness.decode(engine, prompts[:2], lambda i: lambda view: 0, "plain", 12)
    margins = exactness.ReferenceMargins(DEMO / "target", torch.device("cpu"))
    # The other run takes the reference's second choice at token 5 of prompt 1.
    prefix = [*prompts[1], *plain[1][:5]]
    with torch.inference_mode():
        logits = margins._load()(torch.tensor([prefix])).logits[0, -1]
    second = int(torch.topk(logits, 2).indices[1])
    other = [plain[0], [*plain[1][:5], second, *plain[1][6:]]]
    report = exactness.compare(prompts[:2], plain, other, margins)
    assert report["identical"] == 1
    (entry,) = report["diverged"]
    assert (entry["prompt"], entry["first_index"], entry["other_token"]) == (1, 5, second)
    # The engine's greedy token is transformers' argmax there: the plain token is top-1.
    assert entry["reference_top1"] == entry["plain_token"] == plain[1][5]
    assert entry["plain_minus_other"] == pytest.approx(entry["top1_minus_top2"])
    assert entry["top1_minus_top2"] >= 0
    assert report["diverged_at_clear_margin"] == (0 if entry["near_tie"] else 1)
