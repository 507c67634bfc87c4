"""Config sections that live with the engines: a pool of vLLM/SGLang servers and the embedded
engine. The daemon's config file (controller/config.py) holds a list of them under ``backends``;
engines read only their own section, so they can be built and tested without the daemon.

Units: a pool's ``spec_tokens`` is k, the number of drafted tokens verified per step. vLLM's
``num_speculative_tokens`` = k; SGLang's ``--speculative-num-draft-tokens`` = k + 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from engines.embedded.events import (
    AttentionChoice,
    CompileMode,
    CompileScope,
    LinearChoice,
    VerifyMode,
)
from policies.types import max_spec_tokens


class Section(BaseModel):
    """A config section: frozen, unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def resolve_path(path: Path, info: ValidationInfo) -> Path:
    """A relative path in a config file is relative to that file's folder (``base_dir``)."""
    base = (info.context or {}).get("base_dir")
    if base is None or path.is_absolute():
        return path
    return Path(base) / path


class PoolConfig(Section):
    """A pool of vLLM or SGLang servers all started with the same k."""

    name: str = Field(min_length=1)
    kind: Literal["vllm", "sglang"]
    urls: list[str] = Field(min_length=1)
    model: str = Field(min_length=1, description="the served model name clients address")
    spec_tokens: int = Field(ge=0, description="k the servers were started with; 0 = no spec")
    block_size: int = Field(default=16, ge=2)
    health_interval_s: float = Field(default=2.0, gt=0)
    health_timeout_s: float = Field(
        default=5.0, gt=0, description="a GET /health slower than this counts as failed"
    )
    unhealthy_after: int = Field(
        default=2,
        ge=1,
        description="consecutive failed health checks that take a serving server out (a "
        "request that cannot reach it takes it out at once; one passing check puts it back)",
    )
    timeout_s: float = Field(default=600.0, gt=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} must start with http:// or https://")
        return [url.rstrip("/") for url in urls]

    @model_validator(mode="after")
    def _k_fits_block(self) -> PoolConfig:
        ceiling = max_spec_tokens(self.block_size)
        if self.spec_tokens > ceiling:
            raise ValueError(f"spec_tokens {self.spec_tokens} exceeds block_size - 1 = {ceiling}")
        return self


class EmbeddedConfig(Section):
    """draftctl's own PyTorch engine; k is chosen per request per step."""

    name: str = Field(min_length=1)
    kind: Literal["embedded"]
    model: str = Field(min_length=1)
    target: Path
    draft: Path
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_batch_size: int = Field(default=8, ge=1)
    max_seq_len: int = Field(default=2048, ge=16)
    torch_compile: bool = False
    # What torch_compile compiles: each forward whole, or the target's decoder-layer step
    # once for all its layers (regional: start-up does not grow with depth). docs/engine.md.
    torch_compile_scope: CompileScope = "forward"
    # How torch_compile compiles: inductor's default; max-autotune (GEMM and other kernel
    # choices benchmarked per shape at start-up: H200 8B batch 1 -9%, batch 8 slower, 6+ min
    # cold start); or coordinate-descent (inductor's own kernels tuned, no GEMM search).
    torch_compile_mode: CompileMode = "default"
    # With torch_compile: the folder for inductor's and Triton's on-disk caches
    # (engines/embedded/compile_cache.py), so a restart reads what the last start compiled
    # (H200 8B max-autotune: 361 s cold, 50 s warm); keep it on a volume that survives the
    # container. null: torch's defaults (/tmp, the home directory); TORCHINDUCTOR_CACHE_DIR /
    # TRITON_CACHE_DIR set in the environment win.
    compile_cache_dir: Path | None = Field(
        default=Path(".draftctl/compile-cache"), validate_default=True
    )
    # CUDA-graph verifies: packed to the tokens the rows use (graphs keyed on a token bucket,
    # each kept only where faster than the padded graph; more graphs at start-up), or every
    # row padded to the widest k. docs/engine.md.
    verify_mode: VerifyMode = "ragged"
    # The target's attention kernel: sdpa (PyTorch SDPA with a dense mask over the whole
    # cache), triton (a split-KV Triton kernel reading only the keys each row uses; CUDA
    # only), or auto (triton on a CUDA device where its start-up check passes, else sdpa;
    # measured faster on the H200). docs/engine.md, "Attention".
    attention: AttentionChoice = "auto"
    # On a CUDA device with the Triton attention: its kernels compiled in worker processes
    # before the CUDA-graph captures (first starts on the H200 8B shape 6-12 s faster). The
    # workers (up to 8) live until the captures begin and may each hold a CUDA context (not
    # measured): false where the GPU has no headroom for that. No effect elsewhere.
    # docs/engine.md.
    compile_attention_ahead: bool = True
    # The linear layers' kernel: aten (PyTorch's: cuBLAS), gemv (a Triton kernel for steps of
    # up to 16 tokens, streaming the weights once), fused (gemv with the layers' RMSNorms, SiLU
    # gate and residual adds inside it at one token a step), or auto (fused on a CUDA device,
    # aten elsewhere). H200 8B batch-1 plain step: 5.05 / 4.88 / 4.70 ms. docs/engine.md.
    linear: LinearChoice = "auto"
    # On a CUDA device: steps where every row has k = 0 keep the target's features in a stash
    # and insert them into the draft's context when the row drafts again (or every 16 plain
    # steps): H200 8B plain step 0.19-0.22 ms faster at batch 1, 8 and 64. docs/engine.md.
    defer_context: bool = True
    # On a CUDA device: a step where every row has k = 0 runs up to this many plain steps
    # queued back to back with one host round trip (the device no longer waits for the
    # host's bookkeeping between them); their tokens stream as that many steps' (1: off; a
    # request arriving meanwhile waits up to this many steps). docs/engine.md, "Plain bursts".
    plain_burst: int = Field(default=4, ge=1, le=16)
    # With CUDA graphs and defer_context: a burst of plain_burst greedy plain steps replays
    # one CUDA graph holding all of them, each step's token fed to the next on the device,
    # instead of a graph, an argmax and the inputs' copies per step (start-up captures one
    # more graph per batch size). Off: no gain measured on an H100 (session 41). docs/engine.md,
    # "One graph per burst".
    plain_burst_graph: bool = False
    # On a CUDA device: a plain burst is followed by the next, queued before the host
    # reads the first, so the device runs plain bursts back to back while the host handles
    # the last one's tokens (and the planner plans the next, one burst stale). Session 46
    # (H100): the real pair's no-spec 1.12x and goodput 1.08x faster, the 8B shape's plain
    # decode 2-3%. docs/engine.md, "Chained plain bursts".
    plain_chain: bool = True
    # On a CUDA device: drafting steps run up to this many back to back the same way (1:
    # off): one-phase steps each row at the k planned for the first; two-phase steps
    # allocated on the device (``slot_allocation: device``) under the first's scoring and
    # budget, each step's own confidence allocated. Session 32's harness: static k = 7
    # +2.6% (outside the A/A spread), goodput +1.1% (inside it). docs/engine.md, "Drafting
    # bursts".
    spec_burst: int = Field(default=4, ge=1, le=16)
    # Work pending with no finished step for this long marks the backend not ready.
    stall_timeout_s: float = Field(default=120.0, gt=0)
    # Measure this engine's step cost at start-up (engines/embedded/step_profile.py) and price
    # the goodput policy's steps with it when the policy names no cost_table; cached in
    # cost_cache_dir by model and device (null: not cached).
    cost_profile: bool = True
    cost_cache_dir: Path | None = Field(
        default=Path(".draftctl/cost-tables"), validate_default=True
    )

    @field_validator("target", "draft", "cost_cache_dir", "compile_cache_dir")
    @classmethod
    def _relative_to_config(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        return None if path is None else resolve_path(path, info)

    @model_validator(mode="after")
    def _compile_needs_cuda(self) -> EmbeddedConfig:
        if self.torch_compile and self.device == "cpu":
            raise ValueError(
                "torch_compile needs CUDA graphs, so device cuda (or auto on a CUDA machine); "
                "set torch_compile: false for cpu"
            )
        if self.torch_compile_scope != "forward" and not self.torch_compile:
            raise ValueError(
                f"torch_compile_scope: {self.torch_compile_scope} only applies with "
                "torch_compile: true; set both, or drop torch_compile_scope"
            )
        if self.torch_compile_mode != "default" and not self.torch_compile:
            raise ValueError(
                f"torch_compile_mode: {self.torch_compile_mode} only applies with "
                "torch_compile: true; set both, or drop torch_compile_mode"
            )
        if self.attention == "triton" and self.device == "cpu":
            raise ValueError(
                "attention: triton runs on CUDA (a Triton kernel); use attention: sdpa on cpu"
            )
        return self
