"""The ``classifier:`` section of the daemon config."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from controller.classifier.text import DEFAULT_MAX_CHARS
from policies.types import Task


class ClassifierConfig(BaseModel):
    """Unknown keys are errors; defaults live here and nowhere else."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Folder with manifest.json + weights.npz from `draftctl classifier train`; null = built-in.
    artifact: str | None = None
    # Below this confidence the request is treated as `fallback_task`.
    min_confidence: float = Field(default=0.55, ge=0.0, le=1.0)
    fallback_task: Task = Task.CHAT
    # Whether a client may name the task itself (the gateway reads the hint).
    allow_client_hint: bool = True
    # How many characters of a request the classifier reads (head 3/4 + tail 1/4 of a long turn).
    max_chars: int = Field(default=DEFAULT_MAX_CHARS, ge=1)
