"""Greedy exactness of the engine as it runs in the benchmark (bf16, CUDA graphs on a GPU):
every prompt decoded with drafting off (k = 0) and again at each setting — k = 4, k = block − 1,
a random k every step, and two-phase steps (every row drafts whole, then verifies a random k
of its own: ``RandomAllocation``) — all prompts batched at once, so rows join and leave mid-run.
With ``--verify-mode ragged`` the per-row settings run ragged verifies, so this is also the
check that ragged and padded steps give the same tokens.

Speculative decoding is lossless in exact arithmetic; in bf16 a verify of width w and a plain
step compute the same logits with different kernels, so a token whose top two logits are
within rounding may flip. Each divergence is therefore reported with the reference's logit
margin at that token: transformers' own forward of the target (an implementation independent
of the engine) on the prompt plus the plain output up to the token. A near-tie (margin of a
few bf16 steps) is rounding; a divergence at a clear margin is a bug.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engines.embedded.engine import Engine
from engines.embedded.events import (
    RequestView,
    SamplingParams,
    SpecController,
    StepReport,
    TokenEvent,
)
from engines.embedded.request import Request
from policies.types import PositionValues, max_spec_tokens

MAX_NEW_TOKENS = 128
# bf16 keeps 8 significant bits: at a logit of magnitude ~16 one step is 0.125. A margin within
# a few steps is a tie the two kernels may break either way.
NEAR_TIE_LOGITS = 0.5


@dataclass(frozen=True)
class Setting:
    name: str
    controller_for: Callable[[int], Callable[[RequestView], int]]


def settings(block_size: int, seed: int = 0) -> list[Setting]:
    k_max = max_spec_tokens(block_size)

    def fixed(k: int) -> Callable[[int], Callable[[RequestView], int]]:
        return lambda i: lambda view: k

    def random_k(i: int) -> Callable[[RequestView], int]:
        rng = random.Random(f"{seed}:{i}")
        return lambda view: rng.randint(1, k_max)

    ks = sorted({4, k_max})
    return [*(Setting(f"k{k}", fixed(k)) for k in ks), Setting("random-k", random_k)]


class RandomAllocation:
    """A slot planner (``SlotPlanner``) that makes every step two-phase: each row drafts all it
    may, then verifies a random k in [0, drafted] (draft, confidence to the host, allocation,
    verify: the path a confidence allocator takes). ``fail``: allocation raises (tests)."""

    def __init__(self, seed: int, fail: bool = False) -> None:
        self.rng = random.Random(seed)
        self.fail = fail
        self.allocated: list[list[int]] = []

    def plan(
        self, views: Sequence[RequestView], controllers: Sequence[SpecController]
    ) -> list[int]:
        return [v.max_spec_tokens for v in views]

    def allocates(self) -> bool:
        return True

    def allocate(
        self,
        views: Sequence[RequestView],
        controllers: Sequence[SpecController],
        confidence: Sequence[PositionValues],
    ) -> list[int]:
        if self.fail:
            raise RuntimeError("allocation broke")
        ks = [self.rng.randint(0, len(c)) for c in confidence]
        self.allocated.append(ks)
        return ks

    def record(self, controllers: Sequence[SpecController], reports: Sequence[StepReport]) -> None:
        return None

    def prepare(self, views: Sequence[RequestView], controllers: Sequence[SpecController]) -> None:
        return None


def decode(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    controller_for: Callable[[int], Callable[[RequestView], int]],
    tag: str,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> list[list[int]]:
    requests = [
        Request(
            f"exact-{tag}-{i}",
            list(ids),
            SamplingParams(max_new_tokens=max_new_tokens),
            controller_for(i),
            {"task": "chat"},
        )
        for i, ids in enumerate(prompts)
    ]
    run_all(engine, requests)
    return [list(r.output_ids) for r in requests]


def run_all(engine: Engine, requests: Sequence[Request]) -> None:
    """Add every request and step the engine until all are done; a failed request raises."""
    for request in requests:
        engine.add(request)
    while engine.has_work:
        for request, event in engine.step():
            if not isinstance(event, TokenEvent):
                raise RuntimeError(f"request {request.request_id} failed: {event}")


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


class ReferenceMargins:
    """The target's logits through transformers, loaded on first use (most runs never need it)."""

    def __init__(self, target_dir: Path, device: torch.device) -> None:
        self._target_dir = target_dir
        self._device = device
        self._model: Any = None

    def at(self, prefix: Sequence[int], plain: int, got: int) -> dict[str, Any]:
        """Margins of the next token after ``prefix``: the plain run's token against the other
        run's, and the reference's top-1 against its top-2 (logit units)."""
        with torch.inference_mode():
            ids = torch.tensor([list(prefix)], device=self._device)
            logits = self._load()(ids).logits[0, -1].float()
        top = torch.topk(logits, 2)
        return {
            "plain_token": plain,
            "other_token": got,
            "reference_top1": int(top.indices[0]),
            "plain_minus_other": float(logits[plain] - logits[got]),
            "top1_minus_top2": float(top.values[0] - top.values[1]),
        }

    def _load(self) -> Any:
        if self._model is None:
            from transformers import AutoModelForCausalLM

            dtype = torch.bfloat16 if self._device.type == "cuda" else torch.float32
            self._model = AutoModelForCausalLM.from_pretrained(
                str(self._target_dir), dtype=dtype, local_files_only=True
            ).to(self._device)
            self._model.eval()
        return self._model


def compare(
    prompts: Sequence[Sequence[int]],
    plain: Sequence[Sequence[int]],
    got: Sequence[Sequence[int]],
    margins: ReferenceMargins | None,
) -> dict[str, Any]:
    """Identical outputs, and each divergence with its index and the reference's margins."""
    diverged = []
    for i, (a, b) in enumerate(zip(plain, got, strict=True)):
        if a == b:
            continue
        at = first_difference(a, b)
        entry: dict[str, Any] = {"prompt": i, "first_index": at}
        if margins is not None and at < min(len(a), len(b)):
            entry.update(margins.at([*prompts[i], *a[:at]], a[at], b[at]))
            entry["near_tie"] = abs(entry["plain_minus_other"]) <= NEAR_TIE_LOGITS
        diverged.append(entry)
    clear = [d for d in diverged if d.get("near_tie") is False]
    return {
        "identical": len(plain) - len(diverged),
        "diverged": diverged,
        "diverged_at_clear_margin": len(clear),
    }


def check(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    target_dir: Path | None,
    max_new_tokens: int = MAX_NEW_TOKENS,
    seed: int = 0,
) -> dict[str, Any]:
    """Every setting against k = 0 on the same engine; see the module docstring."""
    device = engine.runner.device
    margins = ReferenceMargins(target_dir, device) if target_dir is not None else None
    plain = decode(engine, prompts, lambda i: lambda view: 0, "k0", max_new_tokens)
    result: dict[str, Any] = {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))] if prompts else [],
        "near_tie_logits": NEAR_TIE_LOGITS,
        "reference": "transformers AutoModelForCausalLM forward of the target",
    }
    for setting in settings(engine.block_size, seed):
        got = decode(engine, prompts, setting.controller_for, setting.name, max_new_tokens)
        result[setting.name] = compare(prompts, plain, got, margins)
    # Two-phase steps: every row drafts whole, then verifies a random k of its own.
    planner, engine.planner = engine.planner, RandomAllocation(seed)
    try:
        got = decode(engine, prompts, lambda i: lambda view: 0, "two-phase", max_new_tokens)
    finally:
        engine.planner = planner
    result["two-phase-random"] = compare(prompts, plain, got, margins)
    return result
