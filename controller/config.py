"""The daemon's configuration file: one pydantic model per section, loaded in one place.

Unknown keys are errors, every problem reads ``<dotted.key>: <message> (line N)`` (see
policies.validation), defaults live here and nowhere else, and nothing mutates a loaded
config. Relative paths are resolved against the folder of the config file.

Units: a pool's ``spec_tokens`` is k, the number of drafted tokens verified per step. vLLM's
``num_speculative_tokens`` = k; SGLang's ``--speculative-num-draft-tokens`` = k + 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from policies.types import Task
from policies.validation import InvalidDocument, Problem, validate_yaml


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _resolve(path: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base_dir")
    if base is None or path.is_absolute():
        return path
    return Path(base) / path


class ServerConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    request_timeout_s: float = Field(default=600.0, gt=0)


class AdminConfig(Section):
    token_env: str = Field(default="DRAFTCTL_ADMIN_TOKEN", min_length=1)


class PolicyConfig(Section):
    path: Path = Field(default=Path("policy.yaml"), validate_default=True)
    versions_dir: Path = Field(default=Path(".draftctl/policy-versions"), validate_default=True)
    reload_debounce_s: float = Field(default=0.5, ge=0)

    @field_validator("path", "versions_dir")
    @classmethod
    def _relative_to_config(cls, path: Path, info: ValidationInfo) -> Path:
        return _resolve(path, info)


class ClassifierConfig(Section):
    artifact: Path | None = None
    min_confidence: float = Field(default=0.55, ge=0, le=1)
    fallback_task: Task = Task.CHAT
    allow_client_hint: bool = True
    max_chars: int = Field(default=4000, ge=1)

    @field_validator("artifact")
    @classmethod
    def _relative_to_config(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        return None if path is None else _resolve(path, info)


class StatsConfig(Section):
    window_s: float = Field(default=60.0, gt=0)
    scrape_interval_s: float = Field(default=5.0, gt=0)


class RemotePool(Section):
    """A pool of vLLM or SGLang servers all started with the same k."""

    name: str = Field(min_length=1)
    kind: Literal["vllm", "sglang"]
    urls: list[str] = Field(min_length=1)
    model: str = Field(min_length=1, description="the served model name clients address")
    spec_tokens: int = Field(ge=0, description="k the servers were started with; 0 = no spec")
    block_size: int = Field(default=16, ge=2)
    health_interval_s: float = Field(default=2.0, gt=0)
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
    def _k_fits_block(self) -> RemotePool:
        if self.spec_tokens > self.block_size - 1:
            raise ValueError(
                f"spec_tokens {self.spec_tokens} exceeds block_size - 1 = {self.block_size - 1}"
            )
        return self


class EmbeddedBackend(Section):
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

    @field_validator("target", "draft")
    @classmethod
    def _relative_to_config(cls, path: Path, info: ValidationInfo) -> Path:
        return _resolve(path, info)

    @model_validator(mode="after")
    def _compile_needs_cuda(self) -> EmbeddedBackend:
        if self.torch_compile and self.device == "cpu":
            raise ValueError(
                "torch_compile needs CUDA graphs, so device cuda (or auto on a CUDA machine); "
                "set torch_compile: false for cpu"
            )
        return self


BackendConfig = Annotated[RemotePool | EmbeddedBackend, Field(discriminator="kind")]


class Config(Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    # Validated (not constructed) when absent, so its paths resolve against the config folder.
    policy: PolicyConfig = Field(default={}, validate_default=True)
    classifier: ClassifierConfig = Field(default_factory=ClassifierConfig)
    stats: StatsConfig = Field(default_factory=StatsConfig)
    backends: list[BackendConfig] = Field(min_length=1)

    @field_validator("backends")
    @classmethod
    def _unique_names(cls, backends: list[BackendConfig]) -> list[BackendConfig]:
        seen: set[str] = set()
        for backend in backends:
            if backend.name in seen:
                raise ValueError(f"backend name {backend.name!r} is used twice")
            seen.add(backend.name)
        return backends

    def models(self) -> list[str]:
        """Served model names, in config order, each once."""
        return list(dict.fromkeys(b.model for b in self.backends))


def parse_config(text: str, base_dir: Path) -> Config:
    """Validate config YAML; relative paths resolve against ``base_dir``."""
    return validate_yaml(Config, text, context={"base_dir": base_dir})


def load_config(path: Path) -> Config:
    """Read and validate the config file at ``path``; raises InvalidDocument with every problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidDocument(
            [Problem("", f"cannot read config file {path}: {exc.strerror}")]
        ) from exc
    return parse_config(text, path.resolve().parent)


def config_schema() -> dict[str, Any]:
    """JSON Schema of the config file, for editor completion."""
    schema = Config.model_json_schema()
    schema["title"] = "draftctl config"
    return schema
