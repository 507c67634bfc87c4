"""Tiny random checkpoints shared by the embedded-engine tests (written once per session)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from engines.embedded.engine import Engine
from engines.embedded.events import RequestView, SamplingParams
from engines.embedded.loader import load_runner
from engines.embedded.request import Request
from tests.tinymodels import write_tiny_pair

BLOCK_SIZE = 8
BIAS_TOKEN = 65  # with bias_strength 0.8 target and draft agree on it often: accept lengths 1..8


@pytest.fixture(autouse=True)
def _one_cpu_thread() -> Iterator[None]:
    """Tiny matmuls gain nothing from threads, and on a loaded shared machine spinning intra-op
    threads make them ~20x slower; restore the setting for other test packages."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_pair(tmp_path_factory.mktemp("plain"), block_size=BLOCK_SIZE, seed=0)


def write_agreeing_pair(folder: Path, block_size: int = BLOCK_SIZE) -> tuple[Path, Path]:
    """A tiny pair whose target and draft agree often (accept lengths up to the block)."""
    return write_tiny_pair(
        folder, block_size=block_size, seed=0, bias_token_id=BIAS_TOKEN, bias_strength=0.8
    )


@pytest.fixture(scope="session")
def agreeing_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_agreeing_pair(tmp_path_factory.mktemp("agree"))


def make_engine(pair: tuple[Path, Path], max_batch_size: int = 8, max_seq_len: int = 256) -> Engine:
    runner = load_runner(pair[0], pair[1], torch.device("cpu"), max_batch_size, max_seq_len)
    return Engine(runner, max_batch_size, max_seq_len)


def random_prompt(seed: int, length: int = 12) -> list[int]:
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def fixed_k(k: int) -> Callable[[RequestView], int]:
    return lambda view: k


def run_all(engine: Engine, requests: list[Request]) -> None:
    for request in requests:
        engine.add(request)
    while engine.has_work:
        engine.step()


def greedy_request(
    name: str, prompt: list[int], max_new_tokens: int, controller: Callable[[RequestView], int]
) -> Request:
    return Request(name, prompt, SamplingParams(max_new_tokens=max_new_tokens), controller, {})
