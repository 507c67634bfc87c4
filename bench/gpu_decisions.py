"""Adaptive k on the embedded engine against its baselines: one arm per call, every policy on
the same requests, in random order, repeated.

    # H200, one device call per arm (each well under 10 minutes):
    python bench/gpu_decisions.py --arm synthetic-8b --out $OUT/synthetic-8b.json
    python bench/gpu_decisions.py --arm synthetic-32b --scale 0.35 --repeats 2 --out ...
    python bench/gpu_decisions.py --arm real-pair --target models/demo/target \\
        --draft models/demo/draft --prompts PROMPTS.jsonl --out ...
    # then merge the arms into bench/results/gpu_decisions.json (ragged verifies; the padded
    # engine's calls are in gpu_decisions_padded.json; docs/goodput.md has each file's merge):
    python bench/gpu_decisions.py --merge A.json B.json ... --out bench/results/gpu_decisions.json
    # CPU check that everything runs (tiny random model, seconds):
    python bench/gpu_decisions.py --arm synthetic-tiny --device cpu --scale 0.05 --repeats 1 ...

Arms: ``synthetic-8b`` / ``synthetic-32b`` are Qwen3-8B / 32B-shaped targets with random bf16
weights and a block-16 DFlash draft of the same width, CUDA graphs, and *synthetic acceptance*
(docs/synthetic.md: every forward runs at its real shape, only the accept decision is drawn);
``real-pair`` is a trained pair with its real acceptance (no oracle there), plus a greedy
exactness check (every spec policy's tokens against no-spec's). Policies: bench/decisions/
policies.py. The trace (bench/decisions/workload.py): phases of fixed concurrency and task
mix, closed loop, each drained before the next; tok/s = tokens emitted / wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.decisions.arms import ENGINE_PROFILE, Arm, load_arm
from bench.decisions.driver import PhaseTally, run_policy
from bench.decisions.policies import NAMES, Built, Context, build
from bench.decisions.report import merge, summarise
from bench.decisions.workload import DEFAULT_PHASES, build_jobs, parse_phases
from engines.config import EmbeddedConfig
from engines.embedded.events import (
    ATTENTIONS,
    COMPILE_MODES,
    COMPILE_SCOPES,
    LINEAR_KERNELS,
    VERIFY_MODES,
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--arm", choices=["synthetic-8b", "synthetic-32b", "synthetic-tiny", "real-pair"]
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON, rewritten after each run")
    parser.add_argument(
        "--label",
        default=None,
        help="the arm's name in the results (default: --arm), e.g. synthetic-8b-split for "
        "another trace on the same arm",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        help="merge arm JSONs into --out (files of one arm pool their runs; PATH=NAME files "
        "PATH under arm NAME)",
    )
    parser.add_argument(
        "--policies",
        default=",".join((*NAMES, "oracle")),
        help="comma-separated (bench/decisions/policies.py); NAME@burst<N> runs NAME with its "
        "drafting steps in bursts of N (Engine.spec_burst, 1-16: one-phase steps, and two-phase "
        "steps allocated on the device, one scoring per burst; @burst1 beside --spec-burst 4: "
        "one step a round trip, as vLLM runs); NAME@chain runs NAME with its plain bursts chained "
        "(Engine.plain_chain: each queued before the last one is read; with --plain-burst above "
        "1), beside NAME unchained in the same call; on a ragged arm "
        "NAME@padded runs "
        "NAME as on the padded engine (the same runner switched to its padded graphs, the "
        "policy built for padded verifies): a same-call padded vs ragged comparison; NAME#N "
        "(N a number) is another instance of NAME, reported on its own: goodput#2 beside "
        "goodput gives the call's A/A (the summary's ratios.paired: aa, noise_aa; any NAME#N: "
        "ratios.paired.twins)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--phases", default=DEFAULT_PHASES, help="NAME:C:N:task=share,...;...")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies requests per phase")
    parser.add_argument("--prompt-tokens", default="32,128", help="MIN,MAX (synthetic arms)")
    parser.add_argument("--output-tokens", default="256,512", help="MIN,MAX")
    parser.add_argument("--profiles", default=None, help="synthetic profile set (default: file's)")
    parser.add_argument(
        "--cost-table",
        default=None,
        help="a cost-table JSON, or 'engine': the arm's own engine steps profiled at start-up "
        "(step_profile.py, as the daemon's embedded backend prices the goodput policy); "
        "default: the arm's committed table (cost_tables/, eager SDPA target forwards)",
    )
    parser.add_argument("--target", type=Path, help="real-pair: target directory")
    parser.add_argument("--draft", type=Path, help="real-pair: draft directory")
    parser.add_argument("--prompts", type=Path, help="real-pair: JSONL of {task, prompt}")
    parser.add_argument(
        "--exactness-prompts", type=int, default=256, help="real-pair: greedy check (0: skip)"
    )
    parser.add_argument(
        "--verify-mode",
        choices=list(VERIFY_MODES),
        default="padded",
        help="the engine's CUDA-graph verify: every row at the widest k (padded) or each row at "
        "its own k (ragged: goodput allocates per slot, vllm-av per row, the oracle verifies "
        "each row's drawn run)",
    )
    parser.add_argument(
        "--compile-scope",
        choices=["off", *COMPILE_SCOPES],
        default="off",
        help="torch.compile the engine's forwards before capture (layer: regional, ~35 s of "
        "start-up on the H200 8B shape; forward: each forward whole, ~4 min); CUDA only; the "
        "arm info records it, so such calls pool only with each other",
    )
    parser.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        default="default",
        help="with --compile-scope: inductor's default, max-autotune (kernel choices "
        "benchmarked at start-up) or coordinate-descent (inductor's own kernels tuned); the "
        "arm info records a mode other than default",
    )
    parser.add_argument(
        "--attention",
        choices=ATTENTIONS,
        default="sdpa",
        help="the target's attention kernel in steps (triton: the split-KV kernel reading only "
        "the keys each row uses); the arm info records triton",
    )
    parser.add_argument(
        "--linear",
        choices=LINEAR_KERNELS,
        default="aten",
        help="the linear layers' kernel (gemv: engines/embedded/gemv.py, steps of up to 16 "
        "tokens; fused: gemv with the layers' norms and adds inside it at one token; CUDA); "
        "the arm info records it",
    )
    parser.add_argument(
        "--defer-context",
        action="store_true",
        help="k = 0 steps stash the draft's context (ModelRunner(defer_context=True)); the arm "
        "info records it",
    )
    parser.add_argument(
        "--plain-burst",
        type=int,
        default=1,
        choices=range(1, 17),
        metavar="N",
        help="k = 0 steps run up to N at a time per host round trip (Engine(plain_burst=N); "
        "default 1, as the calls before session 29 ran; the engine's CUDA default is 4); the "
        "arm info records it when above 1",
    )
    parser.add_argument(
        "--plain-chain",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="each plain burst queued before the last one is read "
        "(Engine(plain_chain=True); needs --plain-burst above 1; the engine's CUDA default "
        "since session 46, so --cuda-defaults sets it unless --no-plain-chain is given); the "
        "arm info records it",
    )
    parser.add_argument(
        "--spec-burst",
        type=int,
        default=1,
        choices=range(1, 17),
        metavar="N",
        help="drafting steps run up to N at a time per host round trip "
        "(Engine(spec_burst=N), synthetic acceptance included: one-phase steps and "
        "two-phase steps allocated on the device; default 1, as the calls before session 32 "
        "ran; the engine's CUDA default is 4); the arm info records it when above 1",
    )
    parser.add_argument(
        "--ends",
        choices=("length", "unseen"),
        default="length",
        help="where requests end: 'length' (at the max_new_tokens the engine is told, as every "
        "call before session 33 ran: a drafting burst's room rule keeps it inside each row's "
        "length) or 'unseen' (at the job's length as at an end-of-sequence token the engine "
        "cannot foresee: bursts run scratch steps past a row's end, as in real traffic; the "
        "arm info records it)",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--cuda-defaults",
        action="store_true",
        help="every kernel, burst and pricing setting the embedded engine runs by default on "
        "CUDA (engines/config.py EmbeddedConfig: --attention triton --linear fused "
        "--defer-context --spec-burst 4 --plain-burst 4 --plain-chain --cost-table engine), "
        "each where its own flag is not given; the other defaults stay as the earlier calls "
        "ran, so they pool",
    )
    parser.add_argument(
        "--warm-up",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run every batch size, width and prompt length once before timing",
    )
    parser.add_argument(
        "--warm-run",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one untimed run of the trace (static-k7) before the timed ones: the eager "
        "batched prefills' shapes (rows x longest prompt of each admission group) are first "
        "used there, not in the first timed run",
    )
    parser.add_argument(
        "--warm-policies",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="build each policy once and give it one untimed pass of another trace (the same "
        "phases, other requests and acceptance draws: seed + 1, keys prefixed 'warm-') before "
        "its first timed run (a policy that learns nothing, no-spec, static-k<N>, "
        "dsd-schedule and the oracle, gets no pass); its timed runs then carry on from what "
        "it learnt, as a long-running server does (default: every run builds its policy "
        "afresh, so adaptive policies pay their cold start in every run). Recorded in "
        "arm_info: a merge never mixes the two protocols. The policies are built and warmed "
        "in an order drawn from the order seed (the report's build_order), not as listed; "
        "each pass's run is kept in the report's warm_runs, in no figure",
    )
    parser.add_argument("--seed", type=int, default=0, help="requests and acceptance draws")
    parser.add_argument(
        "--order-seed",
        default=None,
        help="the policies' random order (default: --seed); another call adding repeats of the "
        "same requests takes another",
    )
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting runs after")
    args = parser.parse_args(argv)
    if args.merge is None and args.arm is None:
        parser.error("--arm is required (or --merge)")
    if args.cuda_defaults:
        if args.device != "cuda":
            parser.error(
                "--cuda-defaults needs --device cuda (they are the engine's CUDA defaults)"
            )
        given = {token.partition("=")[0] for token in (sys.argv[1:] if argv is None else argv)}
        defaults = cuda_defaults()
        for action in parser._actions:
            if action.dest in defaults and not given & set(action.option_strings):
                setattr(args, action.dest, defaults[action.dest])
    if args.compile_scope != "off" and args.device != "cuda":
        parser.error("--compile-scope needs --device cuda (compiled forwards run as CUDA graphs)")
    if args.compile_mode != "default" and args.compile_scope == "off":
        parser.error("--compile-mode needs --compile-scope forward or layer")
    if args.attention == "triton" and args.device != "cuda":
        parser.error("--attention triton needs --device cuda")
    if args.linear != "aten" and args.device != "cuda":
        parser.error(f"--linear {args.linear} needs --device cuda")
    for name in args.policies.split(","):
        name, hashed, instance = name.strip().partition("#")
        if hashed and not instance.isdigit():
            parser.error(
                f"policy {name}#{instance}: the instance after '#' must be a number (goodput#2)"
            )
        _, at, engine = name.partition("@")
        if at and (_burst_of(name) is not None or _chained(name)):
            continue
        if at and (engine != "padded" or args.verify_mode != "ragged"):
            parser.error(
                f"policy {name.strip()!r}: the suffixes are @padded, on a ragged arm "
                "(--verify-mode ragged: the policy on the same runner's padded graphs), "
                "@burst<N>, N from 1 to 16 (its drafting steps in bursts of N; 1: one a round "
                "trip), and @chain (its plain bursts chained)"
            )
    return args


def cuda_defaults() -> dict[str, Any]:
    """The harness settings that match the embedded engine's defaults on a CUDA device
    (``EmbeddedConfig``: ``attention``/``linear`` ``auto`` resolve to the Triton attention and
    the fused linear kernel there; its start-up cost profile prices the goodput policy)."""
    fields = EmbeddedConfig.model_fields
    return {
        "attention": "triton",
        "linear": "fused",
        "defer_context": fields["defer_context"].default,
        "spec_burst": fields["spec_burst"].default,
        "plain_burst": fields["plain_burst"].default,
        "plain_chain": fields["plain_chain"].default,
        "cost_table": ENGINE_PROFILE if fields["cost_profile"].default else None,
    }


def _burst_of(name: str) -> int | None:
    """``NAME@burst<N>``'s N (the engine's ``spec_burst`` for that policy's runs; 1: one
    drafting step a host round trip, as vLLM runs, on an arm whose ``--spec-burst`` is
    higher), else None."""
    suffix = name.partition("#")[0].partition("@")[2]
    digits = suffix.removeprefix("burst")
    if suffix.startswith("burst") and digits.isdigit() and 1 <= int(digits) <= 16:
        return int(digits)
    return None


def _chained(name: str) -> bool:
    """``NAME@chain``: the policy's runs chain their plain bursts (``Engine.plain_chain``)."""
    return name.partition("#")[0].partition("@")[2] == "chain"


def _graphs(runner: Any) -> dict[str, Any]:
    return {
        "padded": len(runner._graphs),
        "ragged": len(runner._ragged_graphs),
        "ragged_dropped": [list(key) for key in runner.ragged_dropped],
        "capture_s": runner.capture_s,
        "capture_parts_s": runner.capture_parts_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    threads = torch.get_num_threads()
    try:
        return _main(parse_args(argv))
    finally:
        torch.set_num_threads(threads)


def _main(args: argparse.Namespace) -> int:
    if args.merge:
        args.out.write_text(json.dumps(merge(args.merge), indent=2) + "\n")
        print(f"merged {len(args.merge)} files into {args.out}")
        return 0
    started = time.perf_counter()
    if args.device == "cpu":
        torch.set_num_threads(1)  # tiny CPU forwards: threads only contend (smoke runs)
    arm: Arm = load_arm(args)
    phases = parse_phases(args.phases, args.scale)
    span = tuple(int(x) for x in args.output_tokens.split(","))
    prompt_span = tuple(int(x) for x in args.prompt_tokens.split(","))
    jobs = build_jobs(phases, args.seed, prompt_span, span, arm.prompt_for)  # type: ignore[arg-type]
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    if arm.context.synthetic is None and "oracle" in names:
        names.remove("oracle")  # it reads drawn acceptance: synthetic arms only
    report: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "arm": args.label or args.arm,
        "engine": args.verify_mode,
        "device": arm.device_name,
        "torch": torch.__version__,
        "load_s": time.perf_counter() - started,
        "phases": [vars(p) | {"mix": {t.value: s for t, s in p.mix.items()}} for p in phases],
        "arm_info": arm.info | ({"warm_policies": True} if args.warm_policies else {}),
        # Per call, not per arm (merges compare arm_info): the ragged graphs the engine timed
        # at start-up and dropped as slower than the padded graph (runner.keep_faster_ragged).
        "graphs": _graphs(arm.engine.runner),
        "runs": [],
    }
    if args.warm_up:
        arm.warm_up(prompt_span)  # type: ignore[arg-type]
    if args.warm_run:
        warm_started = time.perf_counter()
        _run(arm, "static-k7", -1, phases, jobs)  # discarded
        report["warm_run_s"] = time.perf_counter() - warm_started
    if arm.context.synthetic is None and args.exactness_prompts:
        report["exactness"] = arm.exactness(args.exactness_prompts)
        _write(args.out, report, names)
    warm: dict[str, tuple[Built, Context]] = {}
    if args.warm_policies:
        warm_jobs = [
            [dataclasses.replace(job, key=f"warm-{job.key}") for job in phase]
            for phase in build_jobs(phases, args.seed + 1, prompt_span, span, arm.prompt_for)  # type: ignore[arg-type]
        ]
        report["warm_pass_s"] = {}
        # Each warm pass's run, kept apart from the timed runs (not in any figure): what a
        # policy learnt there carries into every timed run (session 41: the real pair's plain
        # width priced 4.73x its table from steps of the warm pass, which were not kept).
        report["warm_runs"] = {}
        # Built (and warmed) in an order drawn from the order seed, recorded: in three GPU
        # calls the instance of an A/A pair built first ran 1-2.5% faster, whichever copy it
        # was (sessions 36, 37 and 41; cause unknown), so a fixed order would hand the
        # policies listed first a bias that no number of blocks averages out.
        report["build_order"] = _build_order(names, args)
        for name in report["build_order"]:
            warm_started = time.perf_counter()
            warm[name] = _build(arm, name)
            if not warm[name][0].learns:
                continue  # a fixed policy: the pass would teach it nothing
            report["warm_runs"][name] = _run(arm, name, -1, phases, warm_jobs, warm[name])
            report["warm_pass_s"][name] = time.perf_counter() - warm_started
    rng = random.Random(f"order:{args.seed if args.order_seed is None else args.order_seed}")
    for repeat in range(args.repeats):
        order = rng.sample(names, len(names))
        for name in order:
            if time.perf_counter() - started > args.budget_s:
                report["stopped_early"] = (
                    f"budget {args.budget_s} s reached before {name} #{repeat}"
                )
                break
            report["runs"].append(_run(arm, name, repeat, phases, jobs, warm.get(name)))
            _write(args.out, report, names)
            run = report["runs"][-1]
            print(
                f"[{time.perf_counter() - started:6.0f}s] repeat {repeat} {name:14s} "
                f"{run['tok_s']:9.1f} tok/s  "
                + "  ".join(
                    f"{p}: {v['tok_s']:.0f} k={v['mean_spec_tokens']:.1f}"
                    for p, v in run["phases"].items()
                ),
                flush=True,
            )
    _write(args.out, report, names)
    print(json.dumps(report["summary"], indent=1)[:6000])
    return 0


def _context(arm: Arm, name: str) -> tuple[str, Context]:
    """The policy's base name and the context it is built for: ``NAME@padded`` is NAME built
    as for a padded engine (it runs on the ragged runner's padded graphs); ``NAME@burst<N>``
    is NAME (run with drafting bursts: ``_run``), ``NAME@chain`` NAME with its plain bursts
    chained; ``NAME#N`` is NAME (another instance: an A/A
    twin)."""
    base, _, engine = name.partition("#")[0].partition("@")
    context = arm.context
    if engine and _burst_of(name) is None and not _chained(name):
        context = dataclasses.replace(context, verify_mode=engine)  # type: ignore[arg-type]
    return base, context


def _build_order(names: list[str], args: argparse.Namespace) -> list[str]:
    """The order ``--warm-policies`` builds the policies in: a permutation drawn from the
    order seed (``--order-seed``, else ``--seed``), not the listed order."""
    seed = args.seed if args.order_seed is None else args.order_seed
    return random.Random(f"build:{seed}").sample(names, len(names))


def _build(arm: Arm, name: str) -> tuple[Built, Context]:
    """The named policy, built once for ``--warm-policies``, and its context."""
    base, context = _context(arm, name)
    return build(base, context), context


def _run(
    arm: Arm,
    name: str,
    repeat: int,
    phases: Any,
    jobs: Any,
    warm: tuple[Built, Context] | None = None,
) -> dict[str, Any]:
    """One run of the named policy over the trace, built afresh unless ``warm`` (a policy
    built once, carrying what its earlier runs taught it); the runner's verify mode is the
    context's for the run (``NAME@padded``: padded graphs) and the engine's ``spec_burst``
    the name's (``NAME@burst<N>``: N; a policy that decides every step afresh, the oracle:
    1; else the arm's ``--spec-burst``), all switched back after. A policy that decides
    every step afresh also runs plain steps one at a time: the oracle's k = 0 (a row whose
    drawn run is 0) would otherwise start a plain burst of ``plain_burst`` steps, and a row
    that accepts a long run at the next step would decode it one token a step (GPU arms,
    where the CUDA default bursts plain steps: session 37's oracle took 244 math steps to
    static-k15's 187)."""
    base, context = _context(arm, name) if warm is None else (name, warm[1])
    runner = arm.engine.runner
    before, bursts = runner.verify_mode, arm.engine.spec_burst
    plain_bursts, chain = arm.engine.plain_burst, getattr(arm.engine, "plain_chain", False)
    runner.verify_mode = context.verify_mode
    try:
        built = build(base, context) if warm is None else warm[0]
        arm.engine.spec_burst = _burst_of(name) or (1 if built.single_steps else bursts)
        if built.single_steps:
            arm.engine.plain_burst = 1
        arm.engine.plain_chain = chain or _chained(name)
        scored = _device_scored(built)
        counted = _step_counts(arm.engine)
        tallies: list[PhaseTally] = run_policy(
            arm.engine,
            built,
            phases,
            jobs,
            context.goodput.verify_width_multiple,
            unseen_ends=arm.info.get("ends") == "unseen",
        )
    finally:
        runner.verify_mode = before
        arm.engine.spec_burst = bursts
        arm.engine.plain_burst = plain_bursts
        arm.engine.plain_chain = chain
    tokens = sum(t.tokens for t in tallies)
    elapsed = sum(t.elapsed_s for t in tallies)
    now = _step_counts(arm.engine)
    run: dict[str, Any] = {
        "policy": name,
        "repeat": repeat,
        "tok_s": tokens / elapsed,
        "phases": {p.name: t.summary() for p, t in zip(phases, tallies, strict=True)},
        "decode_step_s_by_shape": _by_shape(tallies),
        # decode steps and the host round trips they took (bursts: fewer trips than steps)
        "step_counts": {
            kind: {"steps": now[kind][0] - was[0], "round_trips": now[kind][1] - was[1]}
            for kind, was in counted.items()
        },
    }
    if scored is not None:  # device-allocated steps of this run, by when they were scored
        after = _device_scored(built)
        assert after is not None
        run["device_scored"] = {"ahead": after[0] - scored[0], "late": after[1] - scored[1]}
    return run


def _step_counts(engine: Any) -> dict[str, tuple[int, int]]:
    """The engine's decode steps and host round trips so far, plain and drafting."""
    return {kind: (c.steps, c.round_trips) for kind, c in engine.step_counts.items()}


def _device_scored(built: Built) -> tuple[int, int] | None:
    """A device-allocating planner's counts of steps scored ahead and late, else None."""
    planner = getattr(built, "planner", None)
    if planner is None or not hasattr(planner, "scored_ahead"):
        return None
    return int(planner.scored_ahead), int(planner.scored_late)


def _by_shape(tallies: list[PhaseTally]) -> dict[str, list[float]]:
    """Mean seconds and count of pure decode steps per (batch x padded width), all phases."""
    merged: dict[str, list[float]] = {}
    for tally in tallies:
        for shape, values in tally.by_shape.items():
            merged.setdefault(shape, []).extend(values)
    return {shape: [statistics.fmean(v), len(v)] for shape, v in sorted(merged.items())}


def _write(path: Path, report: dict[str, Any], names: list[str]) -> None:
    report["summary"] = summarise(report["runs"], names)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
