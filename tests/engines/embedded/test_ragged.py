"""Ragged verify graphs (issue 16): token buckets, static index buffers, and the fixed-shape
step that replays them. CUDA graphs cannot run on the CPU, so the runner's graph path runs here
with the same static buffers called eagerly (``StaticCall``): padded batch and width buckets,
whole-cache attention, index buffers filled on the host, the shared logits buffer. Tokens must
equal the padded graph path, the eager packed path and target-only greedy decoding."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from engines.embedded.cuda_graphs import StaticCall
from engines.embedded.engine import Engine
from engines.embedded.events import Attention, RequestView, VerifyMode
from engines.embedded.loader import load_runner
from engines.embedded.packing import Packing
from engines.embedded.ragged import RaggedShapes, full_rows, ragged_index, token_ladder
from engines.embedded.request import Request
from engines.embedded.runner import GRAPH_BATCH_SIZES, ModelRunner
from engines.embedded.target import target_layer_step
from tests.engines.embedded.conftest import BLOCK_SIZE, greedy_request, random_prompt
from tests.engines.embedded.test_lossless import PROMPT_LEN, target_only_greedy
from tests.engines.embedded.test_two_phase import RandomAllocation

NUM_PROMPTS, NEW_TOKENS, MAX_BATCH = 10, 24, 6


def test_token_ladder_rounds_up_by_at_most_an_eighth_past_64() -> None:
    ladder = token_ladder(2048)
    assert ladder[:9] == [8, 16, 24, 32, 40, 48, 56, 64, 72]
    assert ladder[-1] == 2048 and ladder == sorted(set(ladder))
    for n in range(65, 2049):
        bucket = next(b for b in ladder if b >= n)
        assert bucket - n <= n / 8, (n, bucket)
    with pytest.raises(ValueError, match="steps_per_doubling=0"):
        token_ladder(64, steps_per_doubling=0)


def test_buckets_are_bounded_and_stay_below_the_padded_token_count() -> None:
    for max_batch, most in ((8, 40), (64, 200), (128, 280)):
        batches = [b for b in GRAPH_BATCH_SIZES if b < max_batch] + [max_batch]
        shapes = RaggedShapes(batches, [1, 8, 16])
        keys = shapes.keys
        assert len(keys) == len(set(keys)) <= most, (max_batch, len(keys))
        assert all(n < b * w for b, w, n in keys), "a bucket reaching B * W is the padded graph"
        assert (1, 8) not in shapes.buckets, "batch 1 pads at most 7 tokens: no ragged graph"


def test_choose_picks_the_smallest_bucket_or_falls_back_to_padded() -> None:
    shapes = RaggedShapes([1, 2, 4, 8], [1, 8])
    assert shapes.buckets[8, 8][0] == 8 and shapes.buckets[8, 8][-1] == 56
    assert shapes.choose([1, 8, 1, 1, 1], 8, 8) == 16  # 12 tokens, not 8 x 8 = 64
    assert shapes.choose([8, 8, 8, 8, 8, 8, 8, 3], 8, 8) is None  # 59 -> 64 = padded
    assert shapes.choose([8] * 7, 8, 8) == 56  # 7 rows padded to 8: the last row costs nothing
    assert shapes.choose([1], 1, 1) is None


def test_keep_faster_keeps_the_buckets_below_the_padded_step_and_falls_back_above() -> None:
    shapes = RaggedShapes([1, 2, 4, 8], [1, 8])
    sizes = shapes.buckets[8, 8]  # 8, 16, ..., 56
    # Measured: a ragged step of N tokens costs 0.5 + N / 64 ms, the padded 8 x 8 step 1.25 ms:
    # ragged pays up to 47 tokens; the 2 x 8 shape's buckets are all slower (dropped whole).
    ragged = {(8, 8, n): 0.5 + n / 64 for n in sizes} | {(2, 8, 8): 2.0}
    dropped = shapes.keep_faster(ragged, {(8, 8): 1.25, (2, 8): 1.0})
    assert shapes.buckets[8, 8] == [n for n in sizes if n < 48]
    assert (2, 8) not in shapes.buckets and (2, 8, 8) in dropped
    assert {(8, 8, n) for n in sizes if n >= 48} <= set(dropped)
    assert shapes.choose([8] * 5, 8, 8) == 40  # still ragged
    assert shapes.choose([8] * 6, 8, 8) is None  # 48 tokens: the padded graph is faster
    assert shapes.choose([8, 1], 2, 8) is None
    # A bucket slower than padded ends the kept ones even if a bigger one measured faster.
    shapes = RaggedShapes([1, 2, 4, 8], [1, 8])
    noisy = {(8, 8, n): 0.1 for n in sizes} | {(8, 8, 24): 9.0}
    shapes.keep_faster(noisy, {(8, 8): 1.0})
    assert shapes.buckets[8, 8] == [8, 16]


def test_ragged_index_packs_rows_and_sends_padding_to_the_scratch_row() -> None:
    index = ragged_index([1, 3, 0], 4, 3, 8)
    assert index[0].tolist() == [0, 3, 4, 5, 0, 0, 0, 0]  # padding gathers token 0
    assert index[1].tolist() == [0, 3, 4, 5, 12, 12, 12, 12]  # and scatters to row 4 * 3
    assert full_rows(19, 8) == [8, 8, 3] and full_rows(16, 8) == [8, 8]
    with pytest.raises(ValueError, match="do not fit"):
        ragged_index([4, 4], 2, 4, 7)


def test_static_packing_matches_the_mask_packing_and_drops_padding() -> None:
    x = torch.arange(24.0).view(4, 3, 2)
    lengths = torch.tensor([1, 3, 0, 2])
    eager = Packing.from_lengths(lengths, 3)
    index = ragged_index(lengths.tolist(), 4, 3, 9)
    static = Packing.from_indices((4, 3), index[0], index[1])
    assert static.num_tokens == 9 and eager.num_tokens == 6
    packed = static.pack(x)
    torch.testing.assert_close(packed[:, :6], eager.pack(x))
    torch.testing.assert_close(static.unpack(packed * 2), eager.unpack(eager.pack(x)) * 2)
    out = torch.full((13, 2), -1.0)  # a reused buffer: padding lands in its scratch row 12
    got = static.unpack(packed, out=out)
    valid = torch.arange(3)[None, :] < lengths[:, None]
    torch.testing.assert_close(got[valid], x[valid])
    assert (got[~valid] == -1).all(), "positions without a token are left as they were"


def graph_runner(
    pair: tuple[Path, Path], mode: VerifyMode, max_batch: int = 4, attention: Attention = "sdpa"
) -> ModelRunner:
    return load_runner(
        *pair,
        torch.device("cpu"),
        max_batch,
        64,
        use_cuda_graphs=True,
        verify_mode=mode,
        attention=attention,
    )


def test_a_runner_says_whether_its_rows_verify_at_their_own_widths(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """What goodput's default step mode follows (``StepController.ragged``): the eager packed
    path and ragged graphs verify each row at its own width, padded graphs do not."""
    eager = load_runner(*agreeing_pair, torch.device("cpu"), 2, 64)
    assert eager.per_row_widths
    padded = graph_runner(agreeing_pair, "padded", max_batch=2)
    assert not padded.per_row_widths
    padded.verify_mode = "ragged"  # switched after capture, as the benchmarks do
    assert padded.per_row_widths


def test_the_runner_times_its_graphs_and_keeps_only_ragged_ones_faster_than_padded(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """What a CUDA runner does at start-up, on the CPU's static calls: every kept bucket
    measured faster than its padded graph, every dropped one not (or after one that was not),
    its graph released, and steps of its token count replay the padded graph."""
    for search in (False, True):  # every graph timed, or the start-up's binary search
        runner = graph_runner(agreeing_pair, "ragged")
        before = set(runner._ragged_graphs)
        dropped = runner.keep_faster_ragged(repeats=2, search=search)
        assert set(dropped) | set(runner._ragged_graphs) == before
        assert not set(dropped) & set(runner._ragged_graphs)
        assert runner.ragged_dropped == dropped
        padded, ragged = runner.graph_ms["padded"], runner.graph_ms["ragged"]
        assert all(t > 0 for t in (*padded.values(), *ragged.values()))
        assert len(ragged) == len(before) if not search else 0 < len(ragged) <= len(before)
        for batch, width, n in runner._ragged_graphs:
            if not search:  # (the search times the cut, not every bucket below it)
                assert ragged[f"{batch}x{width}x{n}"] < padded[f"{batch}x{width}"]
        assert set(runner.ragged_shapes.keys) == set(runner._ragged_graphs)


@torch.inference_mode()
def test_ragged_verify_forward_matches_the_padded_forward(agreeing_pair: tuple[Path, Path]) -> None:
    padded, ragged = graph_runner(agreeing_pair, "padded"), graph_runner(agreeing_pair, "ragged")
    spec_tokens = [0, 5, 2]
    batch, width = 4, 8  # 3 rows padded to the batch bucket 4, widest 6 to the width bucket 8
    ids = torch.randint(0, 256, (batch, width), generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([[10], [20], [7], [30]]) + torch.arange(width)
    for runner in (padded, ragged):  # the same earlier context in both caches
        runner._verify_forward(ids, positions - width)
    lengths = [k + 1 for k in spec_tokens]
    num_tokens = ragged.ragged_shapes.choose(lengths, batch, width)
    assert num_tokens == 16, num_tokens  # 10 tokens -> bucket 16, not 4 x 8 = 32
    index = ragged_index(lengths, batch, width, num_tokens)
    want = padded._verify_forward(ids, positions)
    got = ragged._ragged_verify_forward(ids, positions, index)
    for row, k in enumerate(spec_tokens):
        torch.testing.assert_close(got[row, : k + 1], want[row, : k + 1])
        written = positions[row, : k + 1]
        for cache in ("target_cache", "draft_cache"):
            mine, theirs = getattr(ragged, cache), getattr(padded, cache)
            torch.testing.assert_close(mine.k[:, row, :, written], theirs.k[:, row, :, written])
            torch.testing.assert_close(mine.v[:, row, :, written], theirs.v[:, row, :, written])


@torch.inference_mode()
def test_a_ragged_verify_writes_only_its_tokens_positions_and_the_scratch_position(
    agreeing_pair: tuple[Path, Path],
) -> None:
    """Cache writes run on the packed tokens: a row's padded positions and the rows of the
    batch bucket without tokens are left as they were; bucket padding lands in the scratch
    position (never read by attention), not at a real position."""
    runner = graph_runner(agreeing_pair, "ragged")
    lengths, batch, width = [3, 1, 5], 4, 8
    ids = torch.randint(0, 256, (batch, width), generator=torch.Generator().manual_seed(2))
    positions = torch.tensor([[12], [4], [9], [20]]) + torch.arange(width)
    caches = [c for cache in (runner.target_cache, runner.draft_cache) for c in (cache.k, cache.v)]
    for cache in caches:
        cache.normal_(generator=torch.Generator().manual_seed(3))
    before = [cache.clone() for cache in caches]
    runner._ragged_verify_forward(ids, positions, ragged_index(lengths, batch, width, 16))
    for cache, old in zip(caches, before, strict=True):
        changed = (cache != old).any(dim=(0, 2, 4))  # [slots, positions]
        expected = torch.zeros_like(changed)
        for row, length in enumerate(lengths):
            expected[row, positions[row, :length]] = True
        expected[0, runner.target_cache.scratch_position] = True
        assert torch.equal(changed, expected)


@torch.inference_mode()
@pytest.mark.parametrize(
    ("scope", "attention"), [("forward", "sdpa"), ("layer", "sdpa"), ("layer", "triton")]
)
def test_ragged_verify_traces_as_one_graph(
    agreeing_pair: tuple[Path, Path], scope: str, attention: Attention
) -> None:
    """``torch_compile`` wraps the ragged forward in ``fullgraph=True`` (``forward``), or
    compiles the target's layer step alone (``layer``: packed cache writes, queries unpacked
    for attention, or with the Triton attention read in place as one opaque op): no host sync
    or graph break may hide in it, the layer step is one graph every layer reuses, and both
    give eager's logits on the rows' valid positions (the eager backend traces without
    compiling kernels)."""
    runner = graph_runner(agreeing_pair, "ragged", attention=attention)
    ids = torch.randint(0, 256, (4, 8), generator=torch.Generator().manual_seed(1))
    positions = torch.tensor([[3], [9], [5], [2]]) + torch.arange(8)
    index = ragged_index([3, 1, 8, 2], 4, 8, 16)
    want = runner._ragged_verify_forward(ids, positions, index).clone()
    torch._dynamo.reset()
    counters.clear()
    traced = runner._ragged_verify_forward
    if scope == "forward":
        traced = torch.compile(traced, fullgraph=True, backend="eager")
    else:  # what compile_layers() does, traced without codegen
        runner.target.layer_step = torch.compile(target_layer_step, fullgraph=True, backend="eager")
    got = traced(ids, positions, index)
    valid = torch.arange(8)[None, :] < torch.tensor([3, 1, 8, 2])[:, None]
    torch.testing.assert_close(got[valid], want[valid])
    assert counters["stats"]["unique_graphs"] == 1


class CountingCall:
    """Wraps a static call and counts its replays."""

    def __init__(self, call: StaticCall, counts: Counter[str], name: str) -> None:
        self.call, self.counts, self.name = call, counts, name

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        self.counts[self.name] += 1
        return self.call(*inputs)


def counting(runner: ModelRunner) -> Counter[str]:
    counts: Counter[str] = Counter()
    for key, call in runner._graphs.items():
        runner._graphs[key] = CountingCall(call, counts, key[0])  # type: ignore[assignment]
    for shape, ragged in runner._ragged_graphs.items():
        runner._ragged_graphs[shape] = CountingCall(ragged, counts, "ragged")  # type: ignore[assignment]
    return counts


def mixed_k(i: int) -> Callable[[RequestView], int]:
    rng = random.Random(i)
    return lambda view: rng.choice([0, 0, 1, 3, 7])


def run(engine: Engine, prompts: list[list[int]]) -> list[Request]:
    requests = [greedy_request(f"r{i}", p, NEW_TOKENS, mixed_k(i)) for i, p in enumerate(prompts)]
    for request in requests:  # more than max_batch: requests join and leave mid-run
        engine.add(request)
    while engine.has_work:
        engine.step()
    return requests


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return [random_prompt(4000 + i, PROMPT_LEN) for i in range(NUM_PROMPTS)]


@pytest.fixture(scope="module")
def expected(agreeing_pair: tuple[Path, Path], prompts: list[list[int]]) -> list[list[int]]:
    return target_only_greedy(agreeing_pair[0], prompts, NEW_TOKENS)


@pytest.mark.parametrize(
    ("mode", "two_phase", "attention"),
    [
        ("padded", False, "sdpa"),
        ("padded", True, "sdpa"),
        ("ragged", False, "sdpa"),
        ("ragged", True, "sdpa"),
        # The split-KV Triton attention (Triton's CPU interpreter here, ~1 min): the same
        # tokens; the ragged runner replays padded graphs too where no bucket is smaller.
        ("ragged", True, "triton"),
    ],
)
def test_graph_steps_equal_target_only_greedy(
    agreeing_pair: tuple[Path, Path],
    prompts: list[list[int]],
    expected: list[list[int]],
    mode: VerifyMode,
    two_phase: bool,
    attention: Attention,
) -> None:
    runner = graph_runner(agreeing_pair, mode, MAX_BATCH, attention)
    assert runner.target.attention == attention
    counts = counting(runner)
    engine = Engine(runner, MAX_BATCH, 64)
    if two_phase:
        engine.planner = RandomAllocation(1)
    requests = run(engine, prompts)
    assert [r.output_ids for r in requests] == expected
    assert len({k for r in requests for k in r.spec_tokens}) > 3
    if mode == "ragged":
        assert runner.ragged_shapes.keys and counts["ragged"] > 10, counts
    else:
        assert counts["ragged"] == 0 and counts["verify"] > 10, counts
    assert runner.block_size == BLOCK_SIZE


def test_the_binary_search_keeps_what_a_full_scan_keeps_timing_a_fraction() -> None:
    """The engine's start-up pruning (``keep_faster_search``): where a ragged step's time grows
    with its tokens, the same buckets as timing every graph (``keep_faster``), with
    ~log2(buckets) + 1 graphs timed per (B, W); a shape with no faster bucket is dropped whole."""
    full, search = RaggedShapes([1, 2, 4, 8, 16, 32, 64], [1, 8, 16]), None
    search = RaggedShapes([1, 2, 4, 8, 16, 32, 64], [1, 8, 16])
    padded = {key: 0.2 + key[0] * key[1] / 700 for key in full.buckets}
    padded[2, 8] = 0.0  # nothing beats it
    times = {key: 0.25 + key[2] / 600 for key in full.keys}  # grows with the token count
    timed: list[tuple[int, int, int]] = []

    def measure(key: tuple[int, int, int]) -> float:
        timed.append(key)
        return times[key]

    dropped_full = full.keep_faster(times, padded)
    dropped, measured = search.keep_faster_search(measure, padded)
    assert sorted(dropped) == sorted(dropped_full) and search.buckets == full.buckets
    assert (2, 8) not in search.buckets
    assert len(set(timed)) == len(timed) == len(measured) < len(times) / 2
    for (batch, width), sizes in RaggedShapes([1, 2, 4, 8, 16, 32, 64], [1, 8, 16]).buckets.items():
        per_shape = [key for key in timed if key[:2] == (batch, width)]
        assert len(per_shape) <= len(sizes).bit_length() + 1
