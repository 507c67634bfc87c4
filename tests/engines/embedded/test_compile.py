"""The forwards stay compilable as one graph (``torch_compile``) and compute what eager does.

The option itself is for CUDA (compiled forwards are captured into CUDA graphs); on CPU the
runner refuses it, so these tests compile the runner's forwards directly, as the capture does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.embedded.loader import load_runner


def test_compile_without_cuda_graphs_is_refused(tiny_pair: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="needs CUDA graphs"):
        load_runner(*tiny_pair, torch.device("cpu"), 2, 64, compile_forwards=True)


@torch.inference_mode()
def test_compiled_forwards_match_eager_without_graph_breaks(
    agreeing_pair: tuple[Path, Path],
) -> None:
    runner = load_runner(*agreeing_pair, torch.device("cpu"), 2, 64)
    ids = torch.tensor([[65, 66], [70, 65]])
    positions = torch.tensor([[3, 4], [9, 10]])
    block = torch.full((2, runner.block_size), runner.mask_token_id)
    block[:, 0] = ids[:, 0]
    block_positions = positions[:, :1] + torch.arange(runner.block_size)
    eager_logits = runner._verify_forward(ids, positions)
    eager_cache = runner.draft_cache.k.clone()
    eager_draft = runner._draft_forward(block, block_positions)
    torch._dynamo.reset()
    # fullgraph=True: a graph break anywhere in either forward fails here.
    verify = torch.compile(runner._verify_forward, fullgraph=True, dynamic=False)
    draft = torch.compile(runner._draft_forward, fullgraph=True, dynamic=False)
    runner.draft_cache.k.zero_()
    torch.testing.assert_close(verify(ids, positions), eager_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(runner.draft_cache.k, eager_cache)  # context written in place
    torch.testing.assert_close(draft(block, block_positions), eager_draft, rtol=1e-4, atol=1e-4)
