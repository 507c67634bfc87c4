"""Scenario files for ``draftctl simulate``: what load to run, on which costs and traces.

A scenario is a list of phases (closed-loop concurrency or an open-loop arrival rate, and a
task mix, each for a duration), per-task prompt/output lengths, where acceptance comes from
(trace files, else a labelled parametric model) and the cost table. Relative paths resolve
against the scenario file. Defaults live here; unknown keys are errors
(``<dotted.key>: <message> (line N)``).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.model import GoodputSpec
from policies.types import TASKS, Task
from policies.validation import validate_yaml
from sim.fleet_config import FleetSpec


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Phase(Section):
    name: str
    duration_s: float = Field(gt=0)
    # Closed loop: this many clients, each sending its next request when the last finishes.
    concurrency: int | None = Field(default=None, ge=1)
    # Open loop instead: requests arrive at this mean rate (per second, all servers together),
    # at Poisson times drawn from the scenario's seed, whatever the servers' speed. 0: idle.
    arrival_rate: float | None = Field(default=None, ge=0)
    # Share of requests per task (normalised; missing tasks get 0).
    mix: dict[Task, float]

    @model_validator(mode="after")
    def _mix(self) -> Phase:
        if any(v < 0 for v in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ValueError("mix needs non-negative shares with a positive sum")
        if (self.concurrency is None) == (self.arrival_rate is None):
            raise ValueError(
                "give either concurrency (closed loop: clients) or arrival_rate (open loop: "
                "requests per second), not both or neither"
            )
        return self

    @property
    def is_open(self) -> bool:
        """Open loop: arrivals at a rate, not clients that wait for their answers."""
        return self.arrival_rate is not None

    @property
    def clients(self) -> int:
        """A closed-loop phase's clients (0 for an open-loop phase)."""
        return self.concurrency or 0


class Lengths(Section):
    # Uniform ranges [lo, hi] in tokens.
    prompt_tokens: tuple[int, int] = (200, 800)
    output_tokens: tuple[int, int] = (200, 800)


class ParametricTask(Section):
    """Conditional acceptance of drafted position 1 and of the last position (linear between).

    Each request draws a logit offset ~ Normal(0, request_spread), so some requests are
    easier than their task's average; that spread is what per-request blending exploits.
    """

    first_rate: float = Field(gt=0, lt=1)
    last_rate: float = Field(gt=0, lt=1)
    request_spread: float = Field(default=0.5, ge=0)


def _parametric_defaults() -> dict[Task, ParametricTask]:
    # Labelled assumption (not measured): block-16 DFlash on Qwen3-8B accepts ~7 tokens per
    # step on math, ~6 on code, ~4 on chat at full block (published DFlash figures' range).
    return {
        Task.MATH: ParametricTask(first_rate=0.93, last_rate=0.84),
        Task.CODE: ParametricTask(first_rate=0.9, last_rate=0.8),
        Task.CHAT: ParametricTask(first_rate=0.8, last_rate=0.7),
    }


class Acceptance(Section):
    # Folder (or file) of traces/*.jsonl recorded at full block; missing -> parametric model.
    traces: Path | None = None
    parametric: dict[Task, ParametricTask] = Field(default_factory=_parametric_defaults)
    # AUC of the draft's top-1 probability against acceptance, for the synthetic confidence
    # the confidence-reading policies see (sim/ragged_choosers.py); None: they get none.
    confidence_auc: float | None = Field(default=None, ge=0.5, lt=1.0)


class Costs(Section):
    # Cost table JSON: T(batch, tokens per request) in seconds (format in docs/goodput.md).
    table: Path = Path("cost/qwen3-8b-h200-from-notes.json")
    # Engine pads each verify width (k + 1) up to a multiple of this.
    verify_width_multiple: int = Field(default=8, ge=1)
    # Draft forward = this fraction of a target forward at full block width (assumed).
    draft_cost_fraction: float = Field(default=0.14, ge=0)
    # How a batch with different k per request is charged. ragged: the verify costs the
    # batch's total (padded) tokens and only drafting rows run the draft. padded: every row
    # verifies at the batch's widest padded width and the draft runs for every row once any
    # row drafts (what engines/embedded/runner.py does today).
    batch_verify: Literal["ragged", "padded"] = "ragged"
    # Host time per decode step on top of the table's forward (scheduling, sampling, the
    # policy itself): the table holds CUDA-graph replay times only.
    step_overhead_s: float = Field(default=0.0, ge=0)
    # A step whose policy reads the draft's confidence (two-phase: draft, confidence to the
    # host, allocation, then the verify's launch) also waits this long plus this much per row
    # with the device idle: on the H200 0.43 / 0.63 / 1.1 ms at 1 / 8 / 64 rows (session 15).
    two_phase_wait_s: float = Field(default=0.0, ge=0)
    two_phase_wait_per_row_s: float = Field(default=0.0, ge=0)
    # Narrow draft graphs (docs/engine.md): a step whose rows draft at most
    # ``narrow_draft_positions`` positions computes only those positions' draft logits, so
    # its draft forward costs this factor of the whole block's, per batch size (linear in
    # log2 of the batch between the sizes given, held beyond them). On the H200 8B shape:
    # {1: 0.998, 8: 0.987, 64: 0.841} (bench/results/draft_widths_h200_2026-12-03.json).
    # None: every draft computes the whole block. One-phase steps draft their widest k;
    # two-phase steps draft what their chooser drafts (the block, or goodput's
    # ``slots_draft_cap``).
    narrow_draft_factor: dict[int, float] | None = None
    narrow_draft_positions: int = Field(default=7, ge=1)

    @model_validator(mode="after")
    def _narrow_factors(self) -> Costs:
        factors = self.narrow_draft_factor
        if factors is not None and (
            not factors or any(b < 1 or not 0 < f <= 1 for b, f in factors.items())
        ):
            raise ValueError(
                "cost.narrow_draft_factor: batch sizes >= 1, each factor in (0, 1], at least one"
            )
        return self

    @property
    def engine_multiple(self) -> int | None:
        """The verify width multiple the simulated engine hands its goodput policy with its
        table, as the embedded engine does (``StepController.offer_cost_table``): a ragged
        engine's own (each row's k + 1 tokens, 1 in the shipped scenarios); None on a padded
        one, whose policy keeps its configured multiple."""
        return self.verify_width_multiple if self.batch_verify == "ragged" else None

    def narrow_factor(self, batch_size: int) -> float:
        """The draft forward's cost factor at ``batch_size`` for a narrow draft (1.0: none)."""
        if not self.narrow_draft_factor:
            return 1.0
        points = sorted(self.narrow_draft_factor.items())
        if batch_size <= points[0][0]:
            return points[0][1]
        for (b0, f0), (b1, f1) in itertools.pairwise(points):
            if batch_size <= b1:
                w = (math.log2(batch_size) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
                return f0 + w * (f1 - f0)
        return points[-1][1]

    # Prefill: fixed seconds per prefill forward plus seconds per prompt token (assumed).
    prefill_base_s: float = Field(default=0.006, ge=0)
    prefill_s_per_token: float = Field(default=2.5e-5, ge=0)
    # batched: the requests admitted together share one prefill forward (one base cost);
    # per_request: one forward per admitted request, each paying the base (what
    # engines/embedded/engine.py does: it prefills each admitted request on its own).
    prefill_batching: Literal["batched", "per_request"] = "batched"


class Policies(Section):
    static_spec_tokens: list[int] = Field(default_factory=lambda: [4, 7, 11, 15])
    include_oracle: bool = True
    # Also run "informed" (true per-request rates; parametric acceptance only).
    include_informed: bool = False
    min_spec_tokens: int = Field(default=4, ge=1)
    # Ragged engines only: draftctl's per-slot allocator and vLLM's adaptive verification
    # (per-row allocation), both reading the draft's confidence (sim/ragged_choosers.py).
    include_allocator: bool = False
    include_vllm_av: bool = False
    # Also the allocator that decides from the task prior which rows draft at all before the
    # draft forward (``SlotAllocator.drafting_rows``), as "allocator-gated".
    include_allocator_gated: bool = False
    # Also the allocator on one-phase ragged steps: each row's k from the task prior and its own
    # history before the draft, no confidence read (no two-phase wait), as "allocator-prior".
    include_allocator_prior: bool = False
    # Also the goodput policy's ``step_mode: auto`` (one-phase below ``slots_min_batch`` rows,
    # then whichever of one-phase and the allocator's two-phase steps is measured faster), as
    # "goodput-auto": what the embedded engine runs on ragged verifies by default.
    include_goodput_auto: bool = False
    # Also "bayes-bound" and "bayes-prefix": references, not policies. They know each request's
    # true per-position rates and every mispredicted token already passed, and read the
    # draft's confidence with the exact likelihood the synthetic confidence is drawn from
    # (bound: every position at once, the synthetic model's joint structure; prefix: each
    # position from those up to it); vLLM's budget rule under the policy file's bounds over
    # those survivals. Survival as well estimated as this model allows (parametric acceptance,
    # confidence_auc set). With min_spec_tokens above 1 also "-min1": k from 1, vLLM's bounds.
    # And "bayes-prefix-task": the prefix read on each task's median rates, every step read as
    # a run's start (what is known of a request before its history: its task).
    include_bayes_bound: bool = False
    # Goodput policy settings (same keys as the policy file's ``goodput`` section).
    goodput: GoodputSpec = Field(default_factory=GoodputSpec)


class Scenario(Section):
    name: str
    description: str = ""
    seed: int = 0
    block_size: int = Field(default=16, ge=2)
    max_batch_size: int = Field(default=128, ge=1)
    phases: list[Phase] = Field(min_length=1)
    lengths: dict[Task, Lengths] = Field(default_factory=lambda: {t: Lengths() for t in TASKS})
    acceptance: Acceptance = Field(default_factory=Acceptance)
    cost: Costs = Field(default_factory=Costs)
    policies: Policies = Field(default_factory=Policies)
    # Width of the time bins in the plots' time series.
    bin_s: float = Field(default=2.0, gt=0)
    # Present: simulate fleets of instances (sim/fleet_config.py) instead of one server.
    fleet: FleetSpec | None = None
    base_dir: Path = Path(".")

    @model_validator(mode="after")
    def _one_loop(self) -> Scenario:
        if len({p.is_open for p in self.phases}) > 1:
            raise ValueError(
                "phases mix closed-loop (concurrency) and open-loop (arrival_rate) load; use "
                "one kind in a scenario (the fitted schedules weigh phases by their requests)"
            )
        return self

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def resolve(self, path: Path) -> Path:
        return path if path.is_absolute() else self.base_dir / path

    def lengths_for(self, task: Task) -> Lengths:
        return self.lengths.get(task, Lengths())


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raises InvalidDocument / OSError naming the file."""
    file = Path(path)
    scenario = validate_yaml(Scenario, file.read_text())
    return scenario.model_copy(update={"base_dir": file.parent})
