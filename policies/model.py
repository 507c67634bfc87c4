"""The policy file's model: what operators edit as YAML (file or admin API).

One document chooses a policy ``kind`` and holds that kind's settings. Bounds are shared:
``min_spec_tokens`` (default 4) and ``max_spec_tokens`` (default: the draft's block size - 1,
resolved per backend at decision time). k = 0 always means drafting off.
"""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies.types import TASKS, Task, max_spec_tokens
from policies.validation import validate_yaml

SpecTokens = int | Literal["max"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _default_table() -> dict[Task, list[SpecTokens]]:
    # Usual tuning advice: full block for math and code up to moderate concurrency, smaller k
    # for chat as load grows, drafting off for chat at high concurrency.
    return {
        Task.MATH: ["max", "max", 7, 4],
        Task.CODE: ["max", "max", 7, 4],
        Task.CHAT: [7, 4, 4, 0],
    }


class StaticSpec(StrictModel):
    """A table of (task, concurrency band) -> k.

    ``concurrency_bands`` are the inclusive upper edges of all bands but the last, ascending:
    ``[8, 32, 64]`` makes four bands: 1-8, 9-32, 33-64 and above 64. Each task lists one k per
    band; ``max`` means max_spec_tokens, 0 means drafting off.
    """

    concurrency_bands: list[int] = Field(default_factory=lambda: [8, 32, 64])
    spec_tokens: dict[Task, list[SpecTokens]] = Field(default_factory=lambda: _default_table())

    @field_validator("concurrency_bands")
    @classmethod
    def _ascending(cls, bands: list[int]) -> list[int]:
        if any(b < 1 for b in bands):
            raise ValueError("band edges must be >= 1")
        if any(b >= c for b, c in itertools.pairwise(bands)):
            raise ValueError("band edges must be strictly ascending")
        return bands

    @field_validator("spec_tokens")
    @classmethod
    def _non_negative(cls, table: dict[Task, list[SpecTokens]]) -> dict[Task, list[SpecTokens]]:
        for task, row in table.items():
            for k in row:
                if isinstance(k, int) and k < 0:
                    raise ValueError(f"{task.value}: k must be >= 0 (0 = drafting off), got {k}")
        return table

    @model_validator(mode="after")
    def _shape(self) -> StaticSpec:
        missing = [t.value for t in TASKS if t not in self.spec_tokens]
        if missing:
            raise ValueError(f"spec_tokens needs a row for every task; missing: {missing}")
        want = len(self.concurrency_bands) + 1
        for task, row in self.spec_tokens.items():
            if len(row) != want:
                raise ValueError(
                    f"spec_tokens.{task.value} has {len(row)} entries but "
                    f"{len(self.concurrency_bands)} band edges make {want} bands"
                )
        return self


def _default_priors() -> dict[Task, list[float]]:
    # Conditional per-position acceptance of a block-16 DFlash draft, deliberately a little
    # below published figures (math ~7, code ~6, chat ~3.5 tokens per step at full block) so
    # that a fresh daemon does not over-draft before it has seen traffic.
    return {Task.MATH: [0.9, 0.86], Task.CODE: [0.86, 0.82], Task.CHAT: [0.75, 0.68]}


class GoodputSpec(StrictModel):
    """Settings of the ``goodput`` policy: choose k maximising E(k) / T(B, k).

    E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j with a_j the conditional acceptance of drafted
    position j (per task, online); T(B, k) the cost of a step at batch size B and verify width
    k + 1 (cost table, refined online). See docs/goodput.md.
    """

    # Prior conditional acceptance per draft position, per task; the last value repeats for
    # the remaining positions ([0.9, 0.86] = 0.9 at position 1, 0.86 from position 2 on).
    prior_accept_rates: dict[Task, list[float]] = Field(default_factory=_default_priors)
    # Weight of the prior, in pseudo-trials per position.
    prior_strength: float = Field(default=30.0, gt=0)
    # Task estimates forget old steps with this half-life (in recorded steps of that task).
    task_half_life_steps: float = Field(default=3000.0, gt=0)
    # A step of the task that drafted nothing ages its estimate as this share of a drafted
    # step: a task that stopped drafting forgets why, so its probes resume and easier text
    # turns drafting on again. 0 (before session 36): it kept its estimate for good. Chosen
    # in simulation (docs/goodput.md "Censoring"): 1 cost ~0.5% on mixed traffic, 0.1 kept
    # less of the gain on steady 64-client chat and code.
    plain_step_age: float = Field(default=0.25, ge=0, le=1)
    # Batch-wide decisions (one k for an engine step's rows) check themselves: what the rows
    # they drafted accepted against what they expected of them scales the drafted part of
    # every later expectation (an online factor, decayed like the task estimates, shrunk to 1
    # by prior_strength tokens). The task estimates learn from steps chosen because they
    # looked easy, so they overstate a row not yet seen (bench/selection_bias.py: 5-30% on
    # the demo pair). On by default since session 48: the real pair on an H100, 16 blocks
    # in three calls (one training), 1.015x goodput without it, its math phase 0.967 ->
    # 1.008x no speculation (docs/goodput.md); the 8B arm 1.001x (s45b).
    shared_calibration: bool = True
    # ... its memory, in row-steps as ``task_half_life_steps`` counts them. With the task
    # estimates' memory (3000, before session 44) it corrected twice what they learn too: one
    # poor first step held the factor at its floor for hundreds of steps. 100: chosen in
    # simulation (15 scenarios x 5 seeds, results/sim/calibration-half-life-sweep.json).
    calibration_half_life_steps: float = Field(default=100.0, gt=0)
    # ... kept per task: each task's rows realized against what the decisions expected of
    # them scale that task's rows only, each task's sums aged by its own row-steps. One
    # factor for every row (false, before session 48) let a task the estimates overstate
    # narrow the others' k: the real pair's chat phase (s45c) drafted k 1.7-2.0 where its
    # code rows accepted 3.9 a step at goodput's k 8-9 (-4.8% in that phase).
    calibration_by_task: bool = True
    # A request's own steps outweigh the task estimate after this many observations.
    request_prior_strength: float = Field(default=6.0, gt=0)
    # ... or, when this lists strengths, per task the one whose blends have predicted that
    # task's drafted row-steps best (each step's accepted run scored under the blend of its
    # row's window before it, log-likelihood summed per task, decayed with
    # ``request_strength_half_life_steps``), once the task has ``request_strength_min_steps``
    # scored steps. How much one request's text says about its next step differs by pair and
    # task: the real pair's math requests accept 1.3 or 2.6 tokens a step by prompt, where
    # the synthetic profiles' requests differ little. Embedded engine's batch planner
    # (policies/batch_width.py). Empty: ``request_prior_strength`` always.
    request_strength_choices: list[float] = Field(default_factory=list)
    request_strength_half_life_steps: float = Field(default=1000.0, gt=0)
    request_strength_min_steps: float = Field(default=50.0, ge=0)
    # How many of the request's most recent steps are used ...
    request_window_steps: int = Field(default=32, ge=1)
    # ... where this many consecutive steps that drafted nothing count as one: what its
    # drafted steps showed outlasts a plain stretch this many times longer (1: every step
    # counts; session 42's real pair re-drafted at a loss every ~32 plain steps at batch 1;
    # 8, session 43's, kept requests whose hard opening gave way to easy text plain for 256
    # steps: bench/plain_return_replay.py chose 3 on four trainings of the pair).
    request_plain_entry_steps: int = Field(default=3, ge=1)
    # Within that window an entry's weight halves every this many entries of age (0 = all
    # equal): text comes in runs of easy and hard stretches.
    request_half_life_steps: float = Field(default=0.0, ge=0)
    # Steps at the start of a request that use the task estimate only and never switch k.
    warmup_steps: int = Field(default=1, ge=0)
    # Keep the previous k unless another k is better by this relative margin.
    hysteresis: float = Field(default=0.03, ge=0, le=1)
    # Drafting must beat a plain step by this relative margin (guards against noise).
    min_gain: float = Field(default=0.02, ge=0, le=1)
    # Chance per decision of verifying one captured width wider to observe censored positions
    # (and, on the embedded engine, that width's step time) ...
    probe_probability: float = Field(default=0.02, ge=0, le=1)
    # ... but only while fewer than this many of the task's recent steps (decayed like its
    # estimates) drafted that width's positions. Keeping that many fresh costs about
    # probe_min_steps x ln 2 / task_half_life_steps of the task's steps (50: ~1.2%).
    probe_min_steps: float = Field(default=50.0, ge=0)
    # A request drafts its first this-many steps (to learn its own acceptance) when the task
    # estimate says drafting loses by less than ``request_probe_margin`` (0 = never).
    request_probe_steps: int = Field(default=2, ge=0)
    request_probe_margin: float = Field(default=0.35, ge=0, le=1)
    # A request that has not drafted for this many steps drafts one step under the same
    # margin, so it notices when its text turns easy again (0 = never); on the embedded
    # engine's shared k (``BatchWidth``) a batch plain for this many steps in a row drafts one
    # step at its best k, so its rows' windows, which plain steps leave as they were, see it.
    request_reprobe_steps: int = Field(default=0, ge=0)
    # Verify widths (k + 1) are padded up to a multiple of this (engine's captured widths).
    verify_width_multiple: int = Field(default=8, ge=1)
    # Draft forward cost as a fraction of a target forward at full block width.
    draft_cost_fraction: float = Field(default=0.14, ge=0)
    # Cost table JSON (relative paths resolve against the policy file's directory).
    cost_table: str | None = None
    # Weight of each observed step time in the online cost fit (scale and per-step overhead
    # per batch size row; exponential forgetting).
    cost_learning_rate: float = Field(default=0.05, gt=0, le=1)
    # Host time per engine step the cost table (GPU forward only) leaves out, in seconds:
    # ``step_overhead_s + batch size x request_overhead_s`` is added to every T(B, k) until the
    # online fit of observed step times separates an overhead of its own (then the fit's).
    step_overhead_s: float = Field(default=0.0, ge=0, le=1)
    request_overhead_s: float = Field(default=0.0, ge=0, le=0.1)
    # Embedded engine, how a step's k are chosen: "shared" (one k for the batch, which the
    # engine's CUDA-graph path verifies padded) or "slots" (a two-phase step: every row drafts,
    # then policies.slot_allocator gives each row its own k from the draft's confidence, the
    # task prior and the request's history; the eager path verifies each row at its own
    # width). Pools ignore it. See docs/allocator.md.
    # "auto": per batch-size bucket, whichever of the two emits more tokens per second of
    # measured step time on this engine, judged on paired blocks around each change of mode
    # since 2026-12-03 (policies/step_mode.py: both are tried in blocks of
    # ``mode_probe_steps`` until each has ``mode_learn_steps`` steps, then the faster runs and
    # the other is re-measured for one block every ``mode_reprobe_steps`` steps; the
    # incumbent keeps its place unless the other is ``mode_margin`` faster). Blocks of 8 steps
    # until 16 each (16 and 32 until 2026-12-02): in a Monte Carlo of the chooser
    # (bench/step_mode_mc.py, bench/results/step_mode_mc.json: mode gaps of -5..+7%, per-step
    # noise 8-25%) the best worst case of the settings tried, 0.2-1.2% more of the best mode's
    # rate where a bucket lives ~100 steps, at most 0.1% less where it lives 2,000.
    # "engine" (the default): "auto" on an engine whose rows verify at their own widths
    # (verify_mode: ragged, or the eager packed path), "shared" on one that pads a step's
    # rows to the widest (CUDA graphs, verify_mode: padded), where two-phase steps save nothing.
    step_mode: Literal["engine", "shared", "slots", "auto"] = "engine"
    mode_probe_steps: int = Field(default=8, ge=1)
    mode_learn_steps: int = Field(default=16, ge=1)
    mode_reprobe_steps: int = Field(default=512, ge=1)
    mode_margin: float = Field(default=0.02, ge=0, le=1)
    # Auto mode, off by default (0): a block being tried (learning or a re-probe) whose last 2
    # steps each ran under this share of the other mode's block just before it ends there,
    # and decides a bucket still learning at once (policies/step_mode.py; learning then
    # starts with one phase). Session 52: built for the real pair's draining 64-row bucket
    # (two-phase learning blocks at a quarter to a half of one-phase's rate, 1.5-3% of the
    # mixed phase in call s52a); at 0.75 it measured inside the noise on three calls and on
    # the compiled 8B arm decided that bucket from two slow first-use steps.
    mode_cut_ratio: float = Field(default=0.0, ge=0, lt=1)
    # Embedded engine, a batch-wide (one-phase) decision while the batch drains: a row left
    # ``drain_quiet_decisions`` decisions ago or more, and none has joined since. Nothing new then
    # shares the steps, and the rows still running are done when the one with the most steps
    # left is: a k is judged by that (the step's priced time x the most of any row's room,
    # what it may still emit, over its expected tokens a step at that k) instead of by the
    # batch's tokens a second. Tokens that drafting wins for a row that would finish early
    # anyway buy nothing there, and the drafting step slows the longest row down unless it
    # gains too (the real pair's mixed-phase drains, session 52: 28 steps fewer than plain but
    # 61 one-row steps at the end against 10, ~1.3% of the phase). Off (false) by default.
    drain_makespan: bool = False
    drain_quiet_decisions: int = Field(default=2, ge=1)
    # Auto mode: a two-phase step the chooser wants only to measure (a probe or its learning,
    # the bucket's incumbent one-phase or not yet known) runs one-phase while the batch-wide
    # decision for the step is plain (k = 0), and the chooser's schedule waits for a step
    # that drafts: a two-phase step drafts every row's whole block, and where no drafting pays
    # it measures only that (the real pair's 64-row steps, session 45: 4.9 ms two-phase
    # probes that verified nothing, against 1.47 ms plain steps, 6-8 a run, ~1.4% of the
    # phase). True: probes run whatever the batch-wide decision (before session 45).
    mode_probe_when_plain: bool = False
    # Auto mode: a step the bucket's two-phase incumbent would run also runs plain while the
    # batch-wide decision is plain (k = 0), as the probes above do (its schedule not advanced).
    # An incumbent learnt under other traffic otherwise drafted every row's whole block where
    # no drafting paid: the real pair's 64-row mixed phase, session 56 (calls s56b, s56e), ran
    # ~735 two-phase steps a run at 3.4-3.7 ms, 620 verifying nothing, against 1.15 ms plain
    # steps. True: two-phase whatever the batch-wide decision (before session 56).
    mode_two_phase_when_plain: bool = False
    # Slots and auto modes: a step with fewer rows than this is planned as in shared mode (one
    # k, one phase). A two-phase step waits on the host between draft and verify (the confidence
    # crosses to the host, the allocator runs, the verify is launched), and a small batch has
    # little to save by ragged widths: on the H200 8B shape that wait (0.5-1.1 ms) was more
    # than the ragged saving at 1 and 8 rows (docs/allocator.md). 1 = always two-phase.
    slots_min_batch: int = Field(default=32, ge=1)
    # Where a two-phase step's allocation runs: "host" (the draft's confidence is copied to the
    # host, the allocator runs there, then the verify is launched: one sync between draft and
    # verify) or "device" (vLLM's split, policies/slot_scoring.py: before the draft the host
    # fixes the step's draft budget from each row's confidence of its previous step and hands
    # the device the allocator's scoring tables; the device scores the fresh confidence and
    # fills the slots the step's token bucket pays for, with no sync). Device needs an engine
    # that verifies per-row widths (the embedded engine's ragged CUDA graphs or its eager path);
    # its steps also run in the engine's drafting bursts (``spec_burst``), a host one's cannot.
    # Default "device" since session 51: with the draft's confidence in one read of its
    # logits (engines/embedded/top1.py) a device-allocated two-phase step got ~0.7 ms cheaper at
    # 64 rows on the H100 8B shape, and the auto chooser's device policy ran 1.0065-1.0069x
    # the host one in each of three compiled calls (10 of 10 blocks above 1; the 64-row phase
    # 1.012-1.015x; docs/ragged-log.md "Session 51"). The real pair has not run it yet.
    slot_allocation: Literal["host", "device"] = "device"
    # Two-phase steps draft at most this many positions per row (None: all the policy's bounds
    # allow). On a CUDA-graph runner a step whose widest k is at most 7 computes 7 positions'
    # draft logits instead of 15 (narrow draft graphs, docs/engine.md): at 64 rows that draft
    # takes 0.84x the whole block's on the H200 8B shape, so a cap of 7 trades the slots past 7,
    # which confidence would rarely fund at large batches, for a cheaper draft. An experiment
    # (bench/gpu_decisions.py ``goodput-cap7``), not yet a measured default.
    slots_draft_cap: int | None = Field(default=None, ge=1)
    # Embedded engine, shared mode: while a batch keeps exactly the same rows, its k is
    # re-decided only as often as keeps the controller's host time (recording the steps and
    # deciding) under ``host_budget`` of the measured step time, and at least every
    # ``max_replan_steps`` steps; a batch whose rows change is decided afresh. 1 = every step.
    # It matters where a step is short (a small target: a few ms per step, host-bound).
    max_replan_steps: int = Field(default=8, ge=1, le=64)
    host_budget: float = Field(default=0.01, gt=0, le=1)
    # A decision that turns drafting on (k > 0 after a plain one) is held for one call, and
    # each decision that keeps drafting after it for twice as many as the last, up to that
    # spacing: the first drafted steps of a stretch reach the rows' windows before the next
    # few are spent. Held for the full spacing, a stretch started on an optimistic task
    # estimate ran ~30 steps at a loss before the rows' own steps were read (session 46's real
    # pair at one row: 8 calls of 4-step bursts, 8 such stretches in a run, math 0.883x no
    # speculation). Chosen on a replay of twelve trainings of the real pair at one row with
    # the engine's bursts and spacing (bench/plain_return_replay.py --burst 4 --spacing 8):
    # 1.018x the full spacing, never worse by file. On an H100 (session 48, the real pair, 17
    # blocks): the first timed math run 1,285 tok/s against 1,240 held fully, overall inside
    # the A/A noise (0.999 +- 0.013). False: every decision is held for the full spacing
    # (before session 47).
    ramp_drafting_holds: bool = True

    @field_validator("prior_accept_rates")
    @classmethod
    def _rates(cls, table: dict[Task, list[float]]) -> dict[Task, list[float]]:
        for task in TASKS:
            row = table.get(task)
            if not row:
                raise ValueError(f"needs a non-empty list for task {task.value!r}")
            bad = [r for r in row if not 0.0 < r < 1.0]
            if bad:
                raise ValueError(f"{task.value}: rates must be in (0, 1), got {bad}")
        return table

    @field_validator("request_strength_choices")
    @classmethod
    def _strengths(cls, choices: list[float]) -> list[float]:
        bad = [c for c in choices if not c > 0]
        if bad:
            raise ValueError(f"strengths must be > 0 (pseudo-steps), got {bad}")
        return sorted(set(choices))

    def prior_for(self, task: Task, num_positions: int) -> list[float]:
        """The prior rates for ``task`` over ``num_positions`` positions (last value repeats)."""
        row = self.prior_accept_rates[task]
        return [row[min(i, len(row) - 1)] for i in range(num_positions)]


class PolicySpec(StrictModel):
    """The whole policy document."""

    kind: Literal["static", "goodput"] = "static"
    min_spec_tokens: int = Field(default=4, ge=1)
    max_spec_tokens: int | None = Field(
        default=None, ge=1, description="default: block_size - 1 of the backend"
    )
    # Pools: a request whose best pool holds more than this many in-flight requests per server
    # above the least-loaded healthy pool goes to that pool instead, at its k (task pools must
    # not queue while another idles). None: never spill. See docs/fleet.md.
    spill_margin: int | None = Field(default=None, ge=0)
    static: StaticSpec = Field(default_factory=StaticSpec)
    goodput: GoodputSpec = Field(default_factory=GoodputSpec)

    @model_validator(mode="after")
    def _bounds(self) -> PolicySpec:
        if self.max_spec_tokens is not None and self.max_spec_tokens < self.min_spec_tokens:
            raise ValueError(
                f"max_spec_tokens ({self.max_spec_tokens}) must be >= "
                f"min_spec_tokens ({self.min_spec_tokens})"
            )
        return self

    def bounds_for(self, block_size: int) -> tuple[int, int]:
        """The effective [min, max] k for a draft of ``block_size`` (k <= block_size - 1)."""
        ceiling = max_spec_tokens(block_size)
        hi = ceiling if self.max_spec_tokens is None else min(self.max_spec_tokens, ceiling)
        lo = min(self.min_spec_tokens, hi)
        return lo, hi


def parse_policy(text: str) -> PolicySpec:
    """Validate policy YAML; raises policies.validation.InvalidDocument with every problem."""
    return validate_yaml(PolicySpec, text)
