"""Narrow draft graphs: a graph step whose widest k is at most 7 (16-token block) replays a
draft graph that computes only the first 7 positions' logits. The block still runs whole
through the draft's layers, so the drafted tokens are those of the whole-block draft, and the
output stays target-only greedy. The runner's graph path runs on the CPU with the same static
buffers called eagerly (``StaticCall``)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import RequestView
from engines.embedded.loader import load_runner
from engines.embedded.runner import ModelRunner
from engines.embedded.step_profile import profile_steps
from tests.engines.embedded.conftest import greedy_request, random_prompt, write_agreeing_pair
from tests.engines.embedded.test_lossless import PROMPT_LEN, target_only_greedy

BLOCK = 16
MAX_BATCH, NEW_TOKENS, NUM_PROMPTS = 4, 24, 6


@pytest.fixture(scope="module")
def pair16(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_agreeing_pair(tmp_path_factory.mktemp("agree16"), BLOCK)


def graph_runner(pair: tuple[Path, Path]) -> ModelRunner:
    return load_runner(*pair, torch.device("cpu"), MAX_BATCH, 96, use_cuda_graphs=True)


class DraftWidths:
    """Counts the draft graph replays per captured draft width."""

    def __init__(self, runner: ModelRunner) -> None:
        self.counts: Counter[int] = Counter()
        for key, call in list(runner._graphs.items()):
            if key[0] == "draft":
                runner._graphs[key] = self._counted(call, key[2])  # type: ignore[assignment]

    def _counted(
        self, call: Callable[..., torch.Tensor], width: int
    ) -> Callable[..., torch.Tensor]:
        def replay(*inputs: torch.Tensor) -> torch.Tensor:
            self.counts[width] += 1
            return call(*inputs)

        return replay


def test_a_16_token_block_captures_draft_graphs_of_7_and_15_outputs(
    pair16: tuple[Path, Path],
) -> None:
    runner = graph_runner(pair16)
    assert runner.block_size == BLOCK and runner.draft_widths == [8, 16]
    for batch in runner.batch_sizes:
        assert {("draft", batch, 8), ("draft", batch, 16)} <= set(runner._graphs)
    ids = torch.randint(0, 256, (3, BLOCK), generator=torch.Generator().manual_seed(0))
    ids[:, 1:] = runner.mask_token_id
    positions = torch.tensor([[5], [9], [2]]) + torch.arange(BLOCK)
    with torch.inference_mode():
        whole = runner._draft_forward(ids, positions).clone()
        narrow = runner._draft_forward(ids, positions, num_outputs=7)
    assert whole.shape[1] == BLOCK - 1 and narrow.shape[1] == 7
    torch.testing.assert_close(narrow, whole[:, :7])
    assert torch.equal(narrow.argmax(-1), whole[:, :7].argmax(-1))
    with pytest.raises(ValueError, match="num_outputs=16"):
        runner.draft.propose(ids, positions, runner.draft_cache, runner.target, num_outputs=16)


def step_k(i: int) -> Callable[[RequestView], int]:
    rng = random.Random(i)
    return lambda view: rng.choice([0, 3, 7, 7, 11, 15])


@pytest.mark.parametrize("narrow", [True, False])
def test_narrow_and_whole_block_drafts_give_target_only_greedy(
    pair16: tuple[Path, Path], narrow: bool
) -> None:
    runner = graph_runner(pair16)
    runner.narrow_drafts = narrow
    widths = DraftWidths(runner)
    engine = Engine(runner, MAX_BATCH, 96)
    prompts = [random_prompt(7000 + i, PROMPT_LEN) for i in range(NUM_PROMPTS)]
    requests = [greedy_request(f"r{i}", p, NEW_TOKENS, step_k(i)) for i, p in enumerate(prompts)]
    for request in requests:  # more than MAX_BATCH: rows join and leave
        engine.add(request)
    while engine.has_work:
        engine.step()
    assert [r.output_ids for r in requests] == target_only_greedy(pair16[0], prompts, NEW_TOKENS)
    if narrow:
        assert widths.counts[8] >= 3 and widths.counts[16] >= 3, widths.counts
    else:
        assert widths.counts[8] == 0 and widths.counts[16] >= 6, widths.counts


def test_the_step_profile_times_whole_block_drafts_and_restores_narrow_drafts(
    pair16: tuple[Path, Path],
) -> None:
    """The start-up profile prices every width with the whole block's draft (what a two-phase
    step pays); the runner's setting comes back afterwards."""
    runner = graph_runner(pair16)
    widths = DraftWidths(runner)
    engine = Engine(runner, MAX_BATCH, 96)
    profile_steps(engine, [1, 2], [1, 2, 8], timed_steps=1)
    assert widths.counts[8] == 0 and widths.counts[16] > 0, widths.counts
    assert runner.narrow_drafts
