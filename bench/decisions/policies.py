"""Every policy the harness compares, as what the embedded engine takes: a step planner (or
none) and the per-request controller of each job. Each run builds its policy afresh, so every
policy starts from the same priors.

- ``no-spec``, ``static-k<N>``: a fixed k, asked per request (no planner);
- ``dsd-schedule``: vLLM's ``num_speculative_tokens_per_batch_size``, made from the cost table
  and the trace's global acceptance (what ``draftctl policy export-schedule`` makes);
- ``vllm-av``: policies/baselines/vllm_av.py (docs/baselines.md);
- ``goodput``: draftctl's controller as the daemon runs it (engines/step_controller.py);
- ``oracle``: reads each row's drawn acceptance ahead (synthetic mode only; a per-step greedy
  choice, not a bound: docs/baselines.md).

On a ragged engine (``verify_mode="ragged"``: each row verified at its own k) the
confidence-reading policies decide per row in two-phase steps (every row drafts all it may,
then each row's k comes from its draft confidence): ``goodput`` runs the goodput policy's
``step_mode: auto`` (per batch size, whichever of one-phase shared k and two-phase per-slot
allocation, policies/slot_allocator.py, emits more per second on this engine: measured,
policies/step_mode.py), ``goodput-slots`` its ``step_mode: slots`` (two-phase from
``slots_min_batch`` rows; not run by default), ``goodput-cap<N>`` ``goodput`` whose two-phase
rows draft at most N positions (``slots_draft_cap``: with N = 7 a 16-token block's narrow draft
graph; not run by default), ``goodput-device`` ``goodput`` whose two-phase steps allocate on
the device (``slot_allocation: device``, policies/slot_scoring.py; the policy's default since
session 51, so ``goodput`` itself; with ``-min<N>`` from N rows, ``slots_min_batch: N``;
``-min1``: at every batch size), ``goodput-host`` ``goodput`` whose two-phase steps allocate on
the host (the default before session 51; ``goodput-host-slots`` in ``step_mode: slots``);
``goodput-device-slots`` always two-phase from ``slots_min_batch`` rows, no chooser, as
vllm-av-device is, whole-block draft: the allocator's scoring against vLLM's on the same step;
any goodput policy with ``-kmin<N>`` appended: the policy file's ``min_spec_tokens`` N, not 4
(issue 16: "min may be set below 4 for experiments"; vLLM's baseline takes any k); with
``-plain<N>`` or ``-reprobe<N>`` appended (after any ``-kmin``): ``request_plain_entry_steps``
or ``request_reprobe_steps`` N (the default against another within one call);
``goodput-device-cap<N>`` with two-phase rows drafting at most N positions: at N = 7 the
narrow draft graph, whose LM head covers 7 positions, not 15), ``vllm-av`` its own per-row
allocation (``decide_rows``) on the host,
``vllm-av-device`` the same allocated on the device as vLLM does (its budget from the previous
step's confidence, the allocation from the fresh one, no sync); the ``oracle`` verifies each
row's drawn run. The fixed policies and ``dsd-schedule`` are the same on both engines.
``goodput-cal``: ``goodput`` with ``shared_calibration: true`` (batch-wide decisions scaled by
what each task's rows they drafted realized against what they expected; the default since
session 48, so now ``goodput`` itself unless the policy file turns it off); ``goodput-nocal``
without it (as before session 48); ``goodput-calone`` with one factor for every task's rows
(``calibration_by_task: false``, as sessions 45-47 ran ``goodput-cal``).
``goodput-probeplain``: ``goodput`` with ``mode_probe_when_plain: true`` (the auto mode's
two-phase probes run while the batch runs plain, as before session 45; not run by default).
``goodput-plainmodes``: ``goodput`` with its auto mode as before session 56 (a two-phase
incumbent's steps run two-phase while the batch runs plain, ``mode_two_phase_when_plain:
true``, and plain steps are timed into its chooser as one phase: ``PlainModesController``).
``goodput-cut``: ``goodput`` with ``mode_cut_ratio`` ``CUT_RATIO`` (the auto mode's tried blocks
that lose by far cut short, learning one phase first; the default in session 52's calls,
off since); ``goodput-nocut``: ``mode_cut_ratio: 0``, the default (named for those calls).
``goodput-drain``: ``goodput`` with ``drain_makespan: true`` (a draining batch's k judged by
when its longest row finishes; off by default).
``goodput-prefillblind``: ``goodput`` whose step controller is told no admission's prefill
(``PrefillBlindController``): its auto mode's chooser times the steps before an admission
with the prefill in them, as before session 54.
``goodput-strength``: ``goodput`` with ``request_strength_choices`` ``STRENGTH_CHOICES`` (each
task's request strength learnt from how well each candidate's blends predicted its steps;
not run by default).
``goodput-noramp``: ``goodput`` with ``ramp_drafting_holds: false`` (every decision held for
the full spacing, as before session 47; not run by default).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bench.decisions.planners import (
    BaselinePlanner,
    DeviceRowAllocationPlanner,
    OraclePlanner,
    RowAllocationPlanner,
    RowPlanner,
    RunOraclePlanner,
)
from bench.decisions.workload import Job
from engines.embedded.events import SpecController, VerifyMode
from engines.embedded.synthetic import SyntheticAcceptance
from engines.step_controller import FixedPolicySource, StepController
from policies.baselines.ragged_cost import TableRaggedCost
from policies.baselines.schedule import BatchSizeSchedule
from policies.baselines.vllm_av import VllmAdaptiveVerification, VllmAvSettings
from policies.costmodel import CostTable
from policies.goodput import GoodputPolicy
from policies.model import GoodputSpec, PolicySpec
from policies.online import OnlineModels
from policies.types import StepCost, Task, max_spec_tokens

STATIC_KS = (4, 7, 11, 15)
# A goodput policy's name with one of these and a number appended runs that setting:
# (suffix, the goodput key, its least value).
SETTING_SUFFIXES = (
    ("-plain", "request_plain_entry_steps", 1),
    ("-reprobe", "request_reprobe_steps", 0),
)
# ``goodput-strength``'s candidate request strengths (pseudo-steps; the default is 6)
STRENGTH_CHOICES = [1.0, 2.0, 4.0, 8.0, 16.0]
CUT_RATIO = 0.75  # ``goodput-cut``: the auto mode's cut as session 52's calls ran it
NAMES = ("no-spec", *(f"static-k{k}" for k in STATIC_KS), "dsd-schedule", "vllm-av", "goodput")


@dataclass
class Context:
    """What policies are built from, per arm."""

    block_size: int
    max_batch_size: int
    cost_table: CostTable
    goodput: GoodputSpec
    global_rates: Mapping[Task, Sequence[float]]  # conditional, per position
    global_mix: Mapping[Task, float]
    synthetic: SyntheticAcceptance | None
    seed: int
    verify_mode: VerifyMode = "padded"  # the engine's; "ragged" picks the per-row policies
    # the goodput policies' min_spec_tokens (``-kmin<N>``); None: the policy file's default
    min_spec_tokens: int | None = None

    def engine_multiple(self) -> int | None:
        """The verify width multiple the engine hands its policies with its table: 1 on a
        ragged engine (each row verifies its own k + 1 tokens), None (the policy's) padded."""
        return 1 if self.verify_mode == "ragged" else None

    def cost(self) -> StepCost:
        """The cost table as the goodput policy prices it before it learns anything."""
        models = OnlineModels(
            self.goodput, self.block_size, self.cost_table, self.engine_multiple()
        )
        snapshot = models.step_cost()
        assert snapshot is not None, "a cost table gives a step cost"
        return snapshot

    def ragged_cost(self) -> TableRaggedCost:
        """The table's cost of a ragged step (B rows, d drafts in all), as vLLM's budget and
        the per-slot allocator price it."""
        model = OnlineModels(self.goodput, self.block_size, self.cost_table).cost
        assert model is not None, "a cost table gives a cost model"
        return TableRaggedCost(model)


@dataclass
class Built:
    """One policy, ready for a run."""

    planner: Any  # an engines.embedded.events.StepPlanner, or None
    controller_for: Callable[[Job], SpecController]
    host: Callable[[], tuple[float, int]]  # (seconds spent deciding, steps decided)
    # whether its runs change what it decides later (False: no-spec, static k, dsd-schedule,
    # oracle: the same decisions from the first step; --warm-policies gives those no pass)
    learns: bool = True
    # whether it must decide every drafting step (the oracle reads each step's drawn runs: a
    # burst would verify the first step's k for all of its steps); the harness runs it one
    # drafting step a call on an arm of bursts
    single_steps: bool = False


def build(name: str, ctx: Context) -> Built:
    """The named policy (see the module docstring)."""
    base, kmin, low = name.rpartition("-kmin")
    if kmin and base.startswith("goodput") and low.isdigit() and int(low) >= 1:
        return build(base, replace(ctx, min_spec_tokens=int(low)))
    for suffix, key, least in SETTING_SUFFIXES:
        base, found, value = name.rpartition(suffix)
        if found and base.startswith("goodput") and value.isdigit() and int(value) >= least:
            update = {key: int(value)}
            return build(base, replace(ctx, goodput=ctx.goodput.model_copy(update=update)))
    block_max = max_spec_tokens(ctx.block_size)
    ragged = ctx.verify_mode == "ragged"
    if name == "no-spec" or name.startswith("static-k"):
        k = 0 if name == "no-spec" else min(int(name.removeprefix("static-k")), block_max)
        return Built(None, lambda job: lambda view: k, lambda: (0.0, 0), learns=False)
    if name == "goodput":
        return _goodput(ctx, "auto")
    if name == "goodput-cal":
        calibrated = ctx.goodput.model_copy(update={"shared_calibration": True})
        return _goodput(replace(ctx, goodput=calibrated), "auto")
    if name == "goodput-nocal":
        uncalibrated = ctx.goodput.model_copy(update={"shared_calibration": False})
        return _goodput(replace(ctx, goodput=uncalibrated), "auto")
    if name == "goodput-calone":
        one = {"shared_calibration": True, "calibration_by_task": False}
        return _goodput(replace(ctx, goodput=ctx.goodput.model_copy(update=one)), "auto")
    if name == "goodput-noramp":
        held = ctx.goodput.model_copy(update={"ramp_drafting_holds": False})
        return _goodput(replace(ctx, goodput=held), "auto")
    if name == "goodput-strength":
        learnt = ctx.goodput.model_copy(update={"request_strength_choices": STRENGTH_CHOICES})
        return _goodput(replace(ctx, goodput=learnt), "auto")
    if name in ("goodput-cut", "goodput-nocut"):
        ratio = CUT_RATIO if name == "goodput-cut" else 0.0
        varied = ctx.goodput.model_copy(update={"mode_cut_ratio": ratio})
        return _goodput(replace(ctx, goodput=varied), "auto")
    if name == "goodput-drain":
        draining = ctx.goodput.model_copy(update={"drain_makespan": True})
        return _goodput(replace(ctx, goodput=draining), "auto")
    if name == "goodput-prefillblind":  # (session 54's A/B: the chooser as before the fix)
        return _goodput(ctx, "auto", controller_type=PrefillBlindController)
    if name == "goodput-plainmodes":  # (session 56's A/B: the step modes as before it)
        plain = ctx.goodput.model_copy(update={"mode_two_phase_when_plain": True})
        return _goodput(replace(ctx, goodput=plain), "auto", controller_type=PlainModesController)
    if name == "goodput-probeplain":
        probing = ctx.goodput.model_copy(update={"mode_probe_when_plain": True})
        return _goodput(replace(ctx, goodput=probing), "auto")
    if name == "goodput-slots":
        return _goodput(ctx, "slots")
    if name == "goodput-device":
        return _goodput(ctx, "auto", allocation="device")
    if name == "goodput-host":  # two-phase steps allocated on the host (the default to s51)
        return _goodput(ctx, "auto", allocation="host")
    if name == "goodput-host-slots":
        return _goodput(ctx, "slots", allocation="host")
    rows = name.removeprefix("goodput-device-min")
    if name.startswith("goodput-device-min") and rows.isdigit() and int(rows) >= 1:
        return _goodput(ctx, "auto", allocation="device", slots_min_batch=int(rows))
    if name == "goodput-device-slots":
        return _goodput(ctx, "slots", allocation="device")
    if name.startswith("goodput-cap") and name.removeprefix("goodput-cap").isdigit():
        return _goodput(ctx, "auto", int(name.removeprefix("goodput-cap")))
    cap = name.removeprefix("goodput-device-cap")
    if name.startswith("goodput-device-cap") and cap.isdigit():
        return _goodput(ctx, "auto", int(cap), allocation="device")
    planner: RowPlanner
    if name == "dsd-schedule":
        planner = BaselinePlanner(
            BatchSizeSchedule.from_acceptance(
                ctx.global_rates,
                ctx.global_mix,
                ctx.cost(),
                PolicySpec().min_spec_tokens,
                block_max,
                ctx.max_batch_size,
            )
        )
    elif name in ("vllm-av", "vllm-av-device"):
        if name == "vllm-av-device" and not ragged:
            raise ValueError("vllm-av-device allocates per row on the device: ragged engine only")
        ragged_cost = ctx.ragged_cost() if ragged else None
        av = VllmAdaptiveVerification(
            VllmAvSettings(max_spec_tokens=block_max), ctx.cost(), ragged_cost
        )
        av.prepare(ctx.max_batch_size)
        if name == "vllm-av-device":
            planner = DeviceRowAllocationPlanner(av.decide_rows, av.device_scoring, av.observed)
        else:
            planner = RowAllocationPlanner(av.decide_rows) if ragged else BaselinePlanner(av)
    elif name == "oracle":
        if ctx.synthetic is None:
            raise ValueError("the oracle reads drawn acceptance ahead: synthetic arms only")
        planner = (
            RunOraclePlanner(ctx.synthetic, block_max)
            if ragged
            else OraclePlanner(ctx.synthetic, ctx.cost(), block_max, PolicySpec().min_spec_tokens)
        )
    else:
        extra = (
            "goodput-slots",
            "goodput-cal",
            "goodput-calone",
            "goodput-nocal",
            "goodput-probeplain",
            "goodput-plainmodes",
            "goodput-cut",
            "goodput-nocut",
            "goodput-drain",
            "goodput-strength",
            "goodput-noramp",
            "goodput-device",
            "goodput-host",
            "goodput-host-slots",
            "goodput-device-min<N>",
            "goodput-device-slots",
            "goodput-cap<N>",
            "goodput-device-cap<N>",
            "goodput...-kmin<N>",
            "goodput...-plain<N>",
            "goodput...-reprobe<N>",
            "vllm-av-device",
            "oracle",
        )
        known = ", ".join((*NAMES, *extra))
        raise ValueError(f"policy {name!r}: known are {known}")
    fixed = name in ("dsd-schedule", "oracle")
    return Built(
        planner,
        lambda job: lambda view: 0,
        lambda: (planner.host_s, planner.calls),
        learns=not fixed,
        single_steps=name == "oracle",
    )


def _goodput(
    ctx: Context,
    ragged_mode: str,
    draft_cap: int | None = None,
    allocation: str | None = None,
    slots_min_batch: int | None = None,
    controller_type: type[StepController] = StepController,
) -> Built:
    """The daemon's step controller; on a ragged engine with the goodput policy's per-step
    mode ``ragged_mode``: ``auto`` (``goodput``: per batch size, one-phase shared k or
    two-phase per-slot allocation, whichever this engine runs faster, measured) or ``slots``
    (``goodput-slots``: two-phase steps from ``slots_min_batch`` rows). ``draft_cap``
    (``goodput-cap<N>``): two-phase rows draft at most N positions (``slots_draft_cap``).
    ``allocation`` (``goodput-device``: "device", ``goodput-host``: "host"; None: the policy
    default's, "device" since session 51): where two-phase steps allocate (``slot_allocation``);
    ``slots_min_batch`` (``goodput-device-min<N>``: N, e.g. 1, so the auto chooser measures both
    modes at every batch size, not from 32 rows): the policy's own. ``controller_type``: the
    step controller's class (``goodput-prefillblind``: ``PrefillBlindController``)."""
    goodput = ctx.goodput
    if ctx.verify_mode == "ragged":
        update: dict[str, object] = {"step_mode": ragged_mode, "slots_draft_cap": draft_cap}
        if allocation is not None:
            update["slot_allocation"] = allocation
        if slots_min_batch is not None:
            update["slots_min_batch"] = slots_min_batch
        goodput = GoodputSpec.model_validate(goodput.model_dump() | update)
    # The engine hands its policy its table with its verify width multiple (a ragged engine
    # prices every k on its own: StepController.offer_cost_table).
    models = OnlineModels(goodput, ctx.block_size, ctx.cost_table, ctx.engine_multiple())
    bounds = {} if ctx.min_spec_tokens is None else {"min_spec_tokens": ctx.min_spec_tokens}
    spec = PolicySpec(kind="goodput", goodput=goodput, **bounds)
    source = FixedPolicySource(spec, GoodputPolicy(goodput), models)
    ragged = ctx.verify_mode == "ragged"
    controller = controller_type(source, ctx.block_size, random.Random(ctx.seed), ragged=ragged)
    return Built(
        controller,
        lambda job: controller.start(job.task, 1.0, 0),
        lambda: (controller.host_s, controller.calls),
    )


class PlainModesController(StepController):
    """The step controller as it was before session 56: its auto mode's chooser is told the
    plain steps too (as one phase). Harness only, with ``mode_two_phase_when_plain: true``, for
    the A/B of that change (``goodput-plainmodes``)."""

    def _times_mode_step(self, drafted: bool) -> bool:
        return True


class PrefillBlindController(StepController):
    """The step controller as it was before session 54: told no admission's prefill, its auto
    mode's chooser times the steps of the call before an admission with that prefill in them
    (``StepController.prefill_time``). Harness only, for the A/B of that change."""

    def prefill_time(self, seconds: float) -> None:
        return None
