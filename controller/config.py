"""The daemon's configuration file: one pydantic model per section, loaded in one place.

Unknown keys are errors, every problem reads ``<dotted.key>: <message> (line N)`` (see
policies.validation), defaults live here and nowhere else, and nothing mutates a loaded
config. Relative paths are resolved against the folder of the config file.

The backend sections (a vLLM/SGLang pool, the embedded engine) live with their engines in
engines/config.py; this file composes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator

from engines.config import EmbeddedConfig, PoolConfig, Section, resolve_path
from policies.types import Task
from policies.validation import InvalidDocument, Problem, validate_yaml


class ServerConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # After SIGTERM: keep listening and serving for drain_grace_s with /readyz answering 503
    # (so a load balancer sees not-ready and stops routing), then stop accepting connections
    # and drain in-flight requests for up to drain_timeout_s. SIGINT (Ctrl-C) skips the grace.
    drain_grace_s: float = Field(default=5.0, ge=0)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    # A new connection must start a request within header_timeout_s, a request's head must be
    # complete within header_timeout_s of its first byte, its body within body_timeout_s of
    # the head: else 408, and the connection is closed (controller/http_protocol.py).
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)  # idle between requests: closed
    # Completion requests admitted at once (reading, waiting or streaming); more get a 429.
    max_inflight: int = Field(default=1024, ge=1)


class AdminConfig(Section):
    token_env: str = Field(default="DRAFTCTL_ADMIN_TOKEN", min_length=1)


class PolicyConfig(Section):
    path: Path = Field(default=Path("policy.yaml"), validate_default=True)
    versions_dir: Path = Field(default=Path(".draftctl/policy-versions"), validate_default=True)
    reload_debounce_s: float = Field(default=0.5, ge=0)

    @field_validator("path", "versions_dir")
    @classmethod
    def _relative_to_config(cls, path: Path, info: ValidationInfo) -> Path:
        return resolve_path(path, info)


class ClassifierConfig(Section):
    artifact: Path | None = None
    min_confidence: float = Field(default=0.55, ge=0, le=1)
    fallback_task: Task = Task.CHAT
    allow_client_hint: bool = True
    max_chars: int = Field(default=4000, ge=1)

    @field_validator("artifact")
    @classmethod
    def _relative_to_config(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        return None if path is None else resolve_path(path, info)


class StatsConfig(Section):
    window_s: float = Field(default=60.0, gt=0)
    scrape_interval_s: float = Field(default=5.0, gt=0)


class RecordingConfig(Section):
    """A trace of the requests served (controller/recording.py): one JSON line per finished
    request with its arrival time, task and task probabilities, token counts, the k chosen
    and each step's accept length where the backend reports them. No prompt or output text."""

    enabled: bool = False
    path: Path = Field(default=Path(".draftctl/traces/served.jsonl"), validate_default=True)
    # The file is rotated past max_bytes (path.1, path.2, ...); max_files are kept in all.
    max_bytes: int = Field(default=16 * 1024 * 1024, ge=4096)
    max_files: int = Field(default=4, ge=1)

    @field_validator("path")
    @classmethod
    def _relative_to_config(cls, path: Path, info: ValidationInfo) -> Path:
        return resolve_path(path, info)


BackendConfig = Annotated[PoolConfig | EmbeddedConfig, Field(discriminator="kind")]


class Config(Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    # Validated (not constructed) when absent, so its paths resolve against the config folder.
    policy: PolicyConfig = Field(default={}, validate_default=True)
    classifier: ClassifierConfig = Field(default_factory=ClassifierConfig)
    stats: StatsConfig = Field(default_factory=StatsConfig)
    recording: RecordingConfig = Field(default={}, validate_default=True)
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
