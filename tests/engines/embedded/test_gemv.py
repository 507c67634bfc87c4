"""The few-token linear kernel (engines/embedded/gemv.py) computes F.linear, traces as one op,
and a runner built on it stays lossless. Run by Triton's CPU interpreter (TRITON_INTERPRET=1,
tests/conftest.py); its timing is the GPU's (bench/gemv_gpu.py)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from engines.embedded.engine import Engine
from engines.embedded.events import LinearKernel, RequestView
from engines.embedded.gemv import (
    CANDIDATES,
    MAX_ROWS,
    ONE_ROW_CONFIG,
    ONE_ROW_WIDE_CONFIG,
    TILE_CONFIG,
    default_config,
    launch,
    linear,
    reference,
    small_linear,
    takes,
)
from engines.embedded.loader import load_runner
from tests.engines.embedded.conftest import BLOCK_SIZE, greedy_request, random_prompt
from tests.engines.embedded.test_lossless import PROMPT_LEN, target_only_greedy


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows", [1, 5, MAX_ROWS])
@pytest.mark.parametrize("bias", [False, True])
def test_small_linear_computes_f_linear(dtype: torch.dtype, rows: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1, 72, generator=gen).to(dtype)  # K not a multiple of the block
    weight = torch.randn(40, 72, generator=gen).to(dtype)
    b = torch.randn(40, generator=gen).to(dtype) if bias else None
    out = small_linear(x, weight, b)
    assert out.shape == (rows, 1, 40) and out.dtype == dtype
    expected = F.linear(x.float(), weight.float(), None if b is None else b.float())
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected, rtol=tolerance, atol=tolerance)


def test_more_rows_and_strided_inputs_take_the_same_values() -> None:
    """Over MAX_ROWS tokens the op is F.linear itself; a strided input is read right."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(24, 32, generator=gen)
    many = torch.randn(MAX_ROWS + 1, 32, generator=gen)
    assert torch.equal(small_linear(many, weight, None), F.linear(many, weight))
    strided = torch.randn(32, 3, generator=gen).t()  # [3, 32], not contiguous
    torch.testing.assert_close(small_linear(strided, weight, None), F.linear(strided, weight))
    assert small_linear(torch.zeros(0, 32), weight, None).shape == (0, 24)


def test_linear_takes_the_kernel_only_when_asked_and_for_floats() -> None:
    gen = torch.Generator().manual_seed(4)
    x, weight = torch.randn(2, 16, generator=gen), torch.randn(8, 16, generator=gen)
    torch.testing.assert_close(linear(x, weight, gemv=True), F.linear(x, weight))
    assert torch.equal(linear(x, weight), F.linear(x, weight))  # off: F.linear itself
    assert takes(x) and not takes(torch.ones(2, 16, dtype=torch.int32))


def test_small_linear_traces_as_one_opaque_op() -> None:
    """``torch.compile(fullgraph=True, dynamic=True)`` takes it as one custom op (its fake
    gives the output's shape) and computes what eager does, at any token count."""
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(24, 32, generator=gen)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: small_linear(x, weight, None) * 2, fullgraph=True)
    for rows in (3, 7, MAX_ROWS + 4):
        x = torch.randn(rows, 32, generator=gen)
        torch.testing.assert_close(compiled(x), 2 * F.linear(x, weight), rtol=1e-4, atol=1e-4)


def half_plain_k(seed: int) -> Callable[[RequestView], int]:
    """k = 0 (a one-token plain step at batch 1) every other step, else any k."""
    rng = random.Random(seed)
    return lambda view: rng.choice((0, rng.randint(1, BLOCK_SIZE - 1)))


@pytest.mark.parametrize(
    ("kernel", "batch", "fused_rows"),
    [("gemv", 4, 1), ("fused", 1, 1), ("fused", 4, 16), ("fused", 1, 16)],
)
def test_a_gemv_runner_is_lossless(
    agreeing_pair: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    kernel: LinearKernel,
    batch: int,
    fused_rows: int,
) -> None:
    """Greedy output of an engine whose linear layers (target, draft, LM head, context
    projection) run the kernel is target-only greedy, with k varying per step. ``fused``:
    steps of at most ``FUSED_MAX_ROWS`` tokens take the norms, the gate and the residual adds
    inside the kernel: one-token plain steps, or (16) every step at batch 1 (verifies, the
    draft's 16-token block) and the verifies of few tokens at batch 4."""
    from engines.embedded import gemv

    monkeypatch.setattr(gemv, "FUSED_MAX_ROWS", fused_rows)
    parts: set[str] = set()
    plain_launch = gemv.launch

    def recording_launch(*args: Any, **kwargs: Any) -> torch.Tensor:
        parts.update(name for name in ("norm_weight", "residual") if kwargs.get(name) is not None)
        parts.update({"act"} if kwargs.get("act") else set())
        return plain_launch(*args, **kwargs)

    monkeypatch.setattr(gemv, "launch", recording_launch)
    prompts = [random_prompt(7000 + i, PROMPT_LEN) for i in range(4)]
    expected = target_only_greedy(agreeing_pair[0], prompts, 10)
    runner = load_runner(*agreeing_pair, torch.device("cpu"), batch, 64, linear=kernel)
    assert runner.linear == kernel and runner.target.gemv and runner.draft.gemv
    engine = Engine(runner, batch, 64)
    requests = [greedy_request(str(i), p, 10, half_plain_k(i)) for i, p in enumerate(prompts)]
    for request in requests:
        engine.add(request)
    while engine.has_work:
        engine.step()
    assert [r.output_ids for r in requests] == expected
    assert max(a for r in requests for a in r.accept_lengths) > 1  # drafts were accepted
    assert parts == ({"norm_weight", "residual", "act"} if kernel == "fused" else set())


def test_gemv_is_refused_off_cuda_outside_the_interpreter(
    tiny_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from engines.embedded import runner

    monkeypatch.setattr(runner, "triton_interpreted", lambda: False)
    with pytest.raises(ValueError, match="linear='gemv' runs on CUDA"):
        load_runner(*tiny_pair, torch.device("cpu"), 2, 64, linear="gemv")
    with pytest.raises(ValueError, match="linear='blas'"):
        load_runner(*tiny_pair, torch.device("cpu"), 2, 64, linear="blas")  # type: ignore[arg-type]


@pytest.mark.parametrize("config", [(4, 32, 1, 1), (8, 64, 2, 2), (32, 16, 1, 1)])
def test_each_block_configuration_computes_the_same(config: tuple[int, int, int, int]) -> None:
    """One token through any configuration (narrow blocks take the one-row path), and several
    through those of 16 or more features; a narrow block for several tokens is refused."""
    gen = torch.Generator().manual_seed(sum(config))
    weight = torch.randn(40, 72, generator=gen)
    bias = torch.randn(40, generator=gen)
    for rows in (1, 6):
        x = torch.randn(rows, 72, generator=gen)
        if rows > 1 and config[0] < 16:
            with pytest.raises(ValueError, match="serves one token only"):
                launch(x, weight, bias, config)
            continue
        torch.testing.assert_close(
            launch(x, weight, bias, config), F.linear(x, weight, bias), rtol=1e-4, atol=1e-4
        )


def test_the_fixed_configurations_are_candidates_and_fit_their_paths() -> None:
    for config in (ONE_ROW_CONFIG, ONE_ROW_WIDE_CONFIG, TILE_CONFIG):
        assert config in CANDIDATES
    assert TILE_CONFIG[0] >= 16  # several tokens take tensor-core tiles
    assert default_config(1, 4096) == ONE_ROW_CONFIG
    assert default_config(1, 12288) == ONE_ROW_WIDE_CONFIG
    assert default_config(2, 12288) == default_config(16, 4096) == TILE_CONFIG


def _parts(gen: torch.Generator, rows: int, n: int, k: int, part: str) -> dict[str, object]:
    """Inputs of one fused part: a norm before, the SiLU gate before, the residual after."""
    x = torch.randn(rows, 2 * k if part == "act" else k, generator=gen)
    args: dict[str, object] = {"x": x, "weight": torch.randn(n, k, generator=gen) / k**0.5}
    if part == "norm":
        args.update(norm_weight=torch.rand(k, generator=gen) + 0.5, eps=1e-6)
    if part == "act":
        args.update(act=True, residual=torch.randn(rows, n, generator=gen))
    if part == "residual":
        args.update(residual=torch.randn(rows, n, generator=gen))
    return args


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows", [1, 6, MAX_ROWS])
@pytest.mark.parametrize("part", ["norm", "act", "residual"])
def test_each_fused_part_computes_the_unfused_layers(
    dtype: torch.dtype, rows: int, part: str
) -> None:
    """The RMSNorm (its squares summed in the product's loop, the scale applied after), the
    SiLU gate and the residual add give what the PyTorch ops give, on both paths (one token,
    tiles); K not a multiple of the block."""
    gen = torch.Generator().manual_seed(rows + len(part))
    args = _parts(gen, rows, 40, 72, part)
    bias = torch.randn(40, generator=gen) if part == "norm" else None
    typed = {
        name: value.to(dtype) if isinstance(value, torch.Tensor) else value
        for name, value in args.items()
    }
    out = small_linear(
        typed.pop("x"), typed.pop("weight"), None if bias is None else bias.to(dtype), **typed
    )  # type: ignore[arg-type]
    expected = reference(args.pop("x"), args.pop("weight"), bias, **args)  # type: ignore[arg-type]
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), expected, rtol=tolerance, atol=tolerance)


def test_the_parts_are_checked_and_larger_steps_take_the_reference() -> None:
    gen = torch.Generator().manual_seed(8)
    args = _parts(gen, MAX_ROWS + 3, 24, 32, "act")
    x, weight = args.pop("x"), args.pop("weight")
    assert torch.equal(small_linear(x, weight, None, **args), reference(x, weight, None, **args))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="64 wide"):
        launch(torch.randn(2, 64), torch.randn(24, 48), None)
    with pytest.raises(ValueError, match="not both"):
        linear(torch.randn(2, 64), torch.randn(24, 32), norm_weight=torch.ones(64), act=True)
