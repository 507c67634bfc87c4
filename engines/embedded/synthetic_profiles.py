"""The synthetic acceptance profile file (``synthetic_profiles.yaml``): schema and loader.

``load_profile_set(name, seed=...)`` builds the ``SyntheticAcceptance`` a benchmark hands to
the engine. Errors name the dotted key, the bad value and the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engines.embedded.synthetic import SyntheticAcceptance
from engines.embedded.synthetic_rates import MAX_DRIFT_CORR, TaskProfile
from policies.validation import validate_yaml

PROFILES_PATH = Path(__file__).with_name("synthetic_profiles.yaml")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Spreads(_Section):
    """Logit-space heterogeneity; None inherits from the enclosing level."""

    request_spread: float | None = Field(default=None, ge=0)
    drift_spread: float | None = Field(default=None, ge=0)
    drift_corr: float | None = Field(default=None, ge=0, le=MAX_DRIFT_CORR)

    def over(self, base: dict[str, float]) -> dict[str, float]:
        mine = self.model_dump(include=set(Spreads.model_fields))
        return {k: base[k] if mine[k] is None else mine[k] for k in base}


class ProfileEntry(Spreads):
    sources: list[str] = Field(min_length=1)
    accept_length: float | None = Field(default=None, gt=1)
    decay: float | None = None  # only with accept_length; 0 = constant rate
    conditional_rates: list[float] | None = None
    unconditional_rates: list[float] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ProfileEntry:
        forms = [self.accept_length, self.conditional_rates, self.unconditional_rates]
        if sum(f is not None for f in forms) != 1:
            raise ValueError(
                "give exactly one of accept_length, conditional_rates, unconditional_rates"
            )
        if self.decay is not None and self.accept_length is None:
            raise ValueError("decay applies to accept_length only")
        return self

    def build(self, num_positions: int, spreads: dict[str, float]) -> TaskProfile:
        if self.accept_length is not None:
            return TaskProfile.from_accept_length(
                self.accept_length, num_positions, decay=self.decay or 0.0, **spreads
            )
        if self.conditional_rates is not None:
            return TaskProfile(tuple(self.conditional_rates), **spreads)
        assert self.unconditional_rates is not None, "validated: one form is set"
        return TaskProfile.from_unconditional_rates(self.unconditional_rates, **spreads)


class ProfileSet(Spreads):
    description: str
    tasks: dict[str, ProfileEntry] = Field(min_length=1)


class ProfileFile(_Section):
    num_positions: int = Field(ge=1)
    default_set: str
    defaults: Spreads
    # AUC of the synthetic draft confidence against acceptance, and where it was measured.
    confidence_auc: float = Field(ge=0.5, lt=1)
    confidence_sources: list[str] = Field(min_length=1)
    sources: dict[str, str]
    sets: dict[str, ProfileSet] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> ProfileFile:
        if self.default_set not in self.sets:
            raise ValueError(f"default_set {self.default_set!r} is not in sets {sorted(self.sets)}")
        if None in self.defaults.model_dump().values():
            raise ValueError("defaults needs request_spread, drift_spread and drift_corr")
        unknown = [s for s in self.confidence_sources if s not in self.sources]
        if unknown:
            raise ValueError(f"confidence_sources: unknown ids {unknown}")
        for name, profile_set in self.sets.items():
            for task, entry in profile_set.tasks.items():
                unknown = [s for s in entry.sources if s not in self.sources]
                if unknown:
                    raise ValueError(f"sets.{name}.tasks.{task}.sources: unknown ids {unknown}")
                rates = entry.conditional_rates or entry.unconditional_rates
                if rates is not None and len(rates) != self.num_positions:
                    raise ValueError(
                        f"sets.{name}.tasks.{task}: {len(rates)} rates, need num_positions="
                        f"{self.num_positions}"
                    )
        return self


def read_profile_file(path: str | Path = PROFILES_PATH) -> ProfileFile:
    file = Path(path)
    try:
        return validate_yaml(ProfileFile, file.read_text())
    except ValueError as exc:
        raise ValueError(f"{file}: {exc}") from exc


def load_profile_set(
    name: str | None = None, *, seed: int = 0, path: str | Path = PROFILES_PATH
) -> SyntheticAcceptance:
    """The named set (default: the file's ``default_set``) with ``seed``: BENCHMARK ONLY."""
    document = read_profile_file(path)
    name = name or document.default_set
    profile_set = document.sets.get(name)
    if profile_set is None:
        raise ValueError(f"synthetic profile set {name!r}: {path} has {sorted(document.sets)}")
    base = profile_set.over(document.defaults.over(_NO_SPREAD))
    profiles: dict[str, TaskProfile] = {}
    for task, entry in profile_set.tasks.items():
        try:
            profiles[task] = entry.build(document.num_positions, entry.over(base))
        except ValueError as exc:
            raise ValueError(f"{path}: sets.{name}.tasks.{task}: {exc}") from exc
    return SyntheticAcceptance(
        profiles, seed=seed, name=name, confidence_auc=document.confidence_auc
    )


def describe_file(path: str | Path = PROFILES_PATH) -> dict[str, Any]:
    """Every set's tasks with their sources and mean accept length at k = num_positions."""
    document = read_profile_file(path)
    out: dict[str, Any] = {}
    for name, profile_set in document.sets.items():
        built = load_profile_set(name, path=path)
        out[name] = {
            task: {
                "accept_length": round(
                    built.profiles[task].expected_accept_length(built.num_positions), 3
                ),
                "sources": entry.sources,
            }
            for task, entry in profile_set.tasks.items()
        }
    return out


_NO_SPREAD = {"request_spread": 0.0, "drift_spread": 0.0, "drift_corr": 0.0}
