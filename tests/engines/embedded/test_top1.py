"""The fused argmax and top-1 probability (engines/embedded/top1.py): torch's argmax (first
index of the largest, ties included) and the softmax's largest value, from any split of the
vocabulary, strided inputs, three dtypes; a runner that takes it stays lossless and reports the
same confidence. Run by Triton's CPU interpreter (TRITON_INTERPRET=1, tests/conftest.py); its
timing is the GPU's (bench/device_step_gpu.py --top1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import SamplingParams
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from engines.embedded.top1 import MAX_SPLITS, num_splits, reference, takes, top1
from tests.engines.embedded.conftest import greedy_request, random_prompt
from tests.engines.embedded.test_lossless import PROMPT_LEN, target_only_greedy


def _exact(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.double(), dim=-1).amax(dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("splits", [None, 1, 3, 7])
@pytest.mark.parametrize("shape", [(3, 5, 1000), (1, 15, 3001), (2, 1, 257)])
def test_top1_is_torch_argmax_and_the_softmax_top(
    dtype: torch.dtype, splits: int | None, shape: tuple[int, int, int]
) -> None:
    batch, width, vocab = shape
    gen = torch.Generator().manual_seed(vocab + width)
    # a slice of a wider block (strided positions), and integer logits (ties everywhere)
    spread = torch.randn(batch, width + 2, vocab, generator=gen).to(dtype)[:, 1 : width + 1]
    tied = torch.randint(-3, 4, (batch, width, vocab), generator=gen).to(dtype)
    for logits in (spread, tied):
        index, prob = top1(logits, True, splits)
        assert torch.equal(index, logits.argmax(dim=-1))
        assert prob is not None and prob.dtype == torch.float32
        torch.testing.assert_close(prob.double(), _exact(logits), rtol=1e-5, atol=1e-7)
        alone, none = top1(logits, False, splits)
        assert torch.equal(alone, index) and none is None


def test_the_largest_value_at_a_split_edge_and_its_repeat_further_on() -> None:
    """The first index wins across splits and lanes: the max placed at a block's last
    column, repeated in a later split, and an all-equal row (index 0, probability 1/vocab)."""
    logits = torch.zeros(2, 2, 900)
    logits[0, 0, 255] = logits[0, 0, 700] = 5.0
    logits[0, 1, 899] = 1.0
    logits[1, 0, 256] = logits[1, 0, 0] = 2.0
    for splits in (1, 2, 4):
        index, prob = top1(logits, True, splits)
        assert index.tolist() == [[255, 899], [0, 0]]
        assert prob is not None
        torch.testing.assert_close(prob[1, 1], torch.tensor(1 / 900))


def test_splits_fill_the_device_for_few_positions_and_stay_in_bounds() -> None:
    assert num_splits(1, 151_936, 2048) == MAX_SPLITS
    assert num_splits(15, 151_936, 2048) == 18
    assert num_splits(960, 151_936, 2048) == 1
    assert num_splits(1, 1000, 2048) == 1  # one block of columns: one split
    index, _ = top1(torch.randn(1, 1, 50), splits=MAX_SPLITS + 5)  # more asked: capped
    assert index.shape == (1, 1)


def test_inputs_the_kernels_do_not_take_go_through_torch() -> None:
    logits = torch.randn(2, 3, 40)
    assert takes(logits)
    transposed = torch.randn(2, 40, 3).transpose(1, 2)  # vocab not contiguous
    integers = torch.randint(0, 9, (2, 3, 40))
    for other in (transposed, integers):
        assert not takes(other)
        index, prob = top1(other, True)
        expected_index, expected_prob = reference(other.float(), True)
        assert torch.equal(index, expected_index)
        assert prob is not None and torch.allclose(prob, expected_prob)
    assert not takes(logits[0])  # two dimensions
    assert top1(torch.zeros(0, 3, 40))[0].shape == (0, 3)


def test_a_runner_on_the_kernels_is_lossless_and_reports_the_same_confidence(
    agreeing_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy steps (drafts, their confidence, the target's tokens; k varying per row) on
    the kernels give target-only greedy output and the confidence PyTorch's reductions give;
    a sampling row in the first steps' batch takes the kernels' confidence for its greedy
    rows."""
    from engines.embedded import runner as runner_module

    launched: list[bool] = []

    def counting(logits: torch.Tensor, with_prob: bool = False) -> tuple[torch.Tensor, ...]:
        launched.append(with_prob and takes(logits))  # (the argmax alone is torch's)
        return top1(logits, with_prob)

    monkeypatch.setattr(runner_module, "top1", counting)
    prompts = [random_prompt(8100 + i, PROMPT_LEN) for i in range(3)]
    expected = target_only_greedy(agreeing_pair[0], prompts, 24)
    outputs: dict[bool, list[list[int]]] = {}
    confidence: dict[bool, list[tuple[float, ...]]] = {}
    for fused in (True, False):
        runner = load_runner(*agreeing_pair, torch.device("cpu"), 4, 64)
        assert not runner.fused_top1  # off by default on a CPU
        runner.fused_top1 = fused
        runner.measure_confidence = True
        engine = Engine(runner, 4, 64)
        requests = [
            greedy_request(str(i), p, 24, lambda view, i=i: (3, 7, 5)[i])
            for i, p in enumerate(prompts)
        ]
        sampled = Request(
            "s", prompts[0], SamplingParams(max_new_tokens=3, temperature=0.8, seed=3),
            lambda view: 4, {},
        )  # fmt: skip
        for request in [*requests, sampled]:
            engine.add(request)
        seen: list[tuple[float, ...]] = []
        while engine.has_work:
            for request, event in engine.step():
                if event.report is not None and request.request_id != "s":
                    seen.append(tuple(event.report.draft_confidence))
        outputs[fused] = [r.output_ids for r in requests]
        confidence[fused] = seen
    assert sum(launched) >= 4  # the drafts' confidence, greedy batches and the mixed one
    assert outputs[True] == outputs[False] == expected
    assert len(confidence[True]) == len(confidence[False]) > 0
    for got, want in zip(confidence[True], confidence[False], strict=True):
        assert len(got) == len(want)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
