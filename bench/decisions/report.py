"""Results: per policy mean and spread over repeats, per phase, and the results file that other
checks read (issue #13; ``engine`` is its input files' ``padded`` or ``ragged``, one engine
per results file): ``{"engine", "command", "arms": {ARM: {"policies": {NAME:
{"tok_s_mean", "tok_s_spread", "repeats", "phases": {PHASE: {"tok_s_mean",
"mean_spec_tokens", "step_ms_mean"}}}}}}}``. Spread = (max - min) / 2 over repeats; each
ratio of goodput to a baseline carries its noise (``noise_vs_<name>``, per phase ``noise``):
the sum of both sides' relative spreads. Per phase also the decode-only ratio (steps that
admitted no request: free of the prefills' run-to-run noise), and overall the controller's
overhead: goodput's decode step time over a static k's at the same batch and width."""

from __future__ import annotations

import gzip
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Fewest pure decode steps of one (batch x width), summed over runs, that the controller-overhead
# ratio (``decode_step_vs_static``) compares.
MIN_SHAPE_STEPS = 20

# What goodput is compared with besides the static k (present in a call or not): vLLM's rule
# allocated on the host, on the device (as the arm runs: in its drafting bursts, if any) and
# one step a round trip as vLLM runs it (@burst1), the batch-size schedule, no speculation
# and the oracle.
BASELINES = (
    "vllm-av",
    "vllm-av-device",
    "vllm-av-device@burst1",
    "dsd-schedule",
    "no-spec",
    "oracle",
)


def _spread(values: Sequence[float]) -> float:
    return (max(values) - min(values)) / 2 if len(values) > 1 else 0.0


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _noise(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The ratio a/b's own noise: the sum of both cells' relative spreads over their repeats. A
    ratio within 1 ± noise is no measured difference."""
    return float(a["tok_s_spread"] / a["tok_s_mean"] + b["tok_s_spread"] / b["tok_s_mean"])


def _step_counts_by_shape(runs: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many pure decode steps of each (batch x padded width) the runs made."""
    counts: dict[str, int] = {}
    for run in runs:
        for shape, (_, count) in run.get("decode_step_s_by_shape", {}).items():
            counts[shape] = counts.get(shape, 0) + int(count)
    return dict(sorted(counts.items()))


def _step_ms_by_shape(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean ms of the pure decode steps of each (batch x padded width), over all runs."""
    seconds: dict[str, float] = {}
    for run in runs:
        for shape, (mean_s, count) in run.get("decode_step_s_by_shape", {}).items():
            seconds[shape] = seconds.get(shape, 0.0) + mean_s * count
    counts = _step_counts_by_shape(runs)
    return {shape: 1e3 * seconds[shape] / counts[shape] for shape in sorted(seconds)}


def _step_vs_static(goodput: dict[str, Any], static: dict[str, Any]) -> dict[str, float]:
    """The controller's overhead: goodput's decode step time over the static runs' at the same
    batch and width, for the shapes at batch 1, 8 and 64 that both ran at least
    ``MIN_SHAPE_STEPS`` times (a ratio of a handful of steps measures nothing: one goodput
    step at 8 x 8 read as +5%). Summaries from before step counts were kept compare every
    shape."""
    out = {}
    counts = goodput.get("decode_steps_by_shape", {})
    for shape, ms in goodput["decode_step_ms_by_shape"].items():
        if shape.split("x")[0] not in ("1", "8", "64"):
            continue
        if counts.get(shape, MIN_SHAPE_STEPS) < MIN_SHAPE_STEPS:
            continue
        same = [
            v
            for p in static.values()
            if (v := p["decode_step_ms_by_shape"].get(shape))
            and p.get("decode_steps_by_shape", {}).get(shape, MIN_SHAPE_STEPS) >= MIN_SHAPE_STEPS
        ]
        if same:
            out[shape] = ms / statistics.fmean(same)
    return out


def summarise(runs: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    for name in names:
        mine = [r for r in runs if r["policy"] == name]
        if not mine:
            continue
        totals = [r["tok_s"] for r in mine]
        phases: dict[str, Any] = {}
        for phase in mine[0]["phases"]:
            cells = [r["phases"][phase] for r in mine]
            phases[phase] = {
                "tok_s_mean": _mean([c["tok_s"] for c in cells]),
                "tok_s_spread": _spread([c["tok_s"] for c in cells]),
                "tok_s_runs": [c["tok_s"] for c in cells],
                "mean_spec_tokens": _mean([c["mean_spec_tokens"] for c in cells]),
                "step_ms_mean": _mean([c["step_ms_mean"] for c in cells]),
                "host_us_per_step": _mean([c["host_us_per_step"] for c in cells]),
                "decode_tok_s_mean": _mean([c.get("decode_tok_s") for c in cells]),
                "mixed_k_steps_mean": _mean([c.get("mixed_k_steps") for c in cells]),
                "verify_tokens_per_step": _mean([c.get("verify_tokens_per_step") for c in cells]),
                "two_phase_allocation_ms": _mean([c.get("two_phase_allocation_ms") for c in cells]),
                "accept_length_by_task": cells[-1]["accept_length_by_task"],
            }
        policies[name] = {
            "decode_step_ms_by_shape": _step_ms_by_shape(mine),
            "decode_steps_by_shape": _step_counts_by_shape(mine),
            "tok_s_mean": statistics.fmean(totals),
            "tok_s_spread": _spread(totals),
            "tok_s_runs": totals,
            "repeats": len(mine),
            "phases": phases,
        }
    ratios = _ratios(policies)
    best_static = ratios.get("best_static_overall") or _best_static(policies)
    paired = _paired(runs, policies, best_static) if len(policies) > 1 else {}
    if ratios or any(paired.values()):
        ratios["paired"] = paired
        common = _common_prefill(runs)
        if common is not None:
            ratios["paired_common_prefill"] = _paired(common, policies, best_static)
    return {"policies": policies, "ratios": ratios}


def _common_prefill(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The runs with each phase's prefill seconds replaced by the call's median for that phase
    (tok/s recomputed: tokens over the phase's time less its own prefill plus the median), or
    None when a run lacks the fields. Every policy prefills the same prompts, but a prefill
    shape's first use costs far more than its later ones (the real pair, H100, session 43: a
    mixed phase's prefill 0.27 s in most runs, 0.46-1.38 s in the run that met new shapes, one
    call 375 ms), and that lands on whichever policy meets it first: ``paired`` keeps it,
    ``paired_common_prefill`` compares the policies on what they decided."""
    try:
        phases = {name for run in runs for name in run["phases"]}
        common = {
            name: statistics.median(
                float(run["phases"][name]["prefill_s"]) for run in runs if name in run["phases"]
            )
            for name in phases
        }
        out = []
        for run in runs:
            cells = {}
            tokens = seconds = 0.0
            for name, cell in run["phases"].items():
                own = float(cell["elapsed_s"]) - float(cell["prefill_s"]) + common[name]
                cells[name] = {**cell, "tok_s": cell["tokens"] / own if own > 0 else 0.0}
                tokens += cell["tokens"]
                seconds += own
            out.append({**run, "phases": cells, "tok_s": tokens / seconds if seconds > 0 else 0.0})
    except (KeyError, TypeError, ValueError, statistics.StatisticsError):
        return None
    return out


def _best_static(policies: dict[str, Any]) -> str | None:
    """The static k of the highest mean tok/s among the call's policies, if any ran."""
    static = [n for n in policies if n.startswith("static-k") and "@" not in n]
    return max(static, key=lambda n: policies[n]["tok_s_mean"], default=None)


def _paired(
    runs: Sequence[dict[str, Any]], policies: dict[str, Any], best_static: str | None
) -> dict[str, Any]:
    """goodput over each baseline within each block (one call's one repeat: every policy once,
    in random order), so a drift of the machine between blocks cancels out of each ratio. With
    an A/A twin (``goodput#2``: another instance of goodput in the same blocks) ``aa`` holds
    the twin's ratios over goodput and ``noise_aa`` the largest distance of one of them from 1;
    a baseline's ``outside_aa`` says whether goodput's mean paired ratio over it lies further
    from 1 than that (a difference the A/A pair never showed). ``variants``: each
    ``goodput-*`` policy over goodput, vllm-av-device, the best static and no-spec, the same
    way;
    ``bursts``: each ``NAME@burst<N>`` over NAME, over vllm-av-device, over
    vllm-av-device@burst<N> (vLLM's rule given the same bursts) and over the best static in
    those bursts (present or not, goodput: a call of burst policies alone is compared too);
    ``chains``: each ``NAME@chain`` (plain bursts chained) over NAME, no-spec@chain and no-spec.
    ``twins``: each A/A twin ``NAME#N`` over NAME. ``phases``: the same per phase."""
    blocks: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for run in runs:
        block = (run.get("call", 0), run.get("repeat", 0))
        blocks.setdefault(block, {})[run["policy"]] = run

    def tok_s(run: dict[str, Any], phase: str | None) -> float:
        return float(run["tok_s"] if phase is None else run["phases"][phase]["tok_s"])

    def cell(a: str, b: str, phase: str | None = None) -> dict[str, Any] | None:
        ratios = [
            tok_s(block[a], phase) / tok_s(block[b], phase)
            for block in blocks.values()
            if a in block and b in block and tok_s(block[b], phase) > 0
        ]
        if not ratios:
            return None
        return {
            "mean": statistics.fmean(ratios),
            "sd": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
            "blocks": len(ratios),
            "ratios": ratios,
        }

    def over(name: str, others: Sequence[str], phase: str | None) -> dict[str, Any]:
        """``name`` paired over each of ``others`` that ran (``vs_<other>``)."""
        against = {
            f"vs_{other}": cell(name, other, phase)
            for other in dict.fromkeys(others)
            if other in policies and other != name
        }
        return {key: v for key, v in against.items() if v is not None}

    def compare(phase: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "goodput" in policies:
            out.update(against_goodput(phase))
        # a policy run in drafting bursts (NAME@burst<N>) over NAME itself, what the bursts
        # give it, and over the closest copy of vLLM (as vLLM runs, and in the same bursts)
        # and the best static in the same bursts, in the same blocks
        bursts: dict[str, Any] = {}
        for name in sorted(n for n in policies if "@burst" in n):
            base, _, suffix = name.partition("@")
            others = (base, "vllm-av-device", f"vllm-av-device@{suffix}", f"{best_static}@{suffix}")
            bursts[name] = over(name, others, phase)
        if bursts:
            out["bursts"] = bursts
        # a policy run with its plain bursts chained (NAME@chain) over NAME itself and over
        # no-spec chained and not (what chaining gives it, and where it then stands)
        chains: dict[str, Any] = {}
        for name in sorted(n for n in policies if n.partition("#")[0].endswith("@chain")):
            base = name.partition("#")[0].removesuffix("@chain")
            chains[name] = over(name, (base, "no-spec@chain", "no-spec"), phase)
        if chains:
            out["chains"] = chains
        # every A/A twin (NAME#N) over NAME in the same blocks: the call's own noise floor for
        # any policy's comparisons (goodput's is also ``aa`` above)
        twins = {
            twin: cell(twin, twin.partition("#")[0], phase)
            for twin in sorted(n for n in policies if "#" in n)
            if twin.partition("#")[0] in policies
        }
        twins = {twin: c for twin, c in twins.items() if c is not None}
        if twins:
            out["twins"] = twins
        return out

    def against_goodput(phase: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        twins = sorted(n for n in policies if n.startswith("goodput#"))
        aa = cell(twins[0], "goodput", phase) if twins else None
        if aa is not None:
            out["aa"] = aa
            out["noise_aa"] = max(abs(r - 1.0) for r in aa["ratios"])
        baselines = (best_static, *BASELINES)
        for name in dict.fromkeys(baselines):
            if name is None or name not in policies:
                continue
            paired = cell("goodput", name, phase)
            if paired is None:
                continue
            if aa is not None:
                paired["outside_aa"] = abs(paired["mean"] - 1.0) > out["noise_aa"]
            out[f"vs_{name}"] = paired
        # goodput's variants (goodput-device-slots, -cap7, ...) over goodput, over the
        # closest copy of vLLM, the best static and no speculation, in the same blocks
        variants: dict[str, Any] = {}
        for variant in sorted(n for n in policies if n.startswith("goodput-")):
            against = {
                f"vs_{name}": cell(variant, name, phase)
                for name in ("goodput", "vllm-av-device", best_static, "no-spec")
                if name is not None and name in policies
            }
            variants[variant] = {key: v for key, v in against.items() if v is not None}
        if variants:
            out["variants"] = variants
        return out

    out = compare(None)
    # Per phase the same, against the overall best static (each phase's best static is in
    # ``ratios.phases``; on these traces it is the same k).
    first = policies.get("goodput") or next(iter(policies.values()))
    out["phases"] = {phase: compare(phase) for phase in first["phases"]}
    return out


def _ratios(policies: dict[str, Any]) -> dict[str, Any]:
    """goodput against the baselines the targets name, overall and per phase."""
    if "goodput" not in policies:
        return {}
    goodput = policies["goodput"]
    static = {n: p for n, p in policies.items() if n.startswith("static-k")}
    out: dict[str, Any] = {}
    if static:
        best = max(static, key=lambda n: static[n]["tok_s_mean"])
        out["best_static_overall"] = best
        out["vs_best_static"] = goodput["tok_s_mean"] / static[best]["tok_s_mean"]
        out["noise_vs_best_static"] = _noise(goodput, static[best])
    for name in ("static-k15", *BASELINES, "goodput@padded"):
        if name in policies:
            out[f"vs_{name}"] = goodput["tok_s_mean"] / policies[name]["tok_s_mean"]
            out[f"noise_vs_{name}"] = _noise(goodput, policies[name])
    out["decode_step_vs_static"] = _step_vs_static(goodput, static)
    per_phase: dict[str, Any] = {}
    for phase, cell in goodput["phases"].items():
        statics = {n: p["phases"][phase]["tok_s_mean"] for n, p in static.items()}
        entry: dict[str, Any] = {}
        if statics:
            best = max(statics, key=lambda n: statics[n])
            entry = {
                "best_static": best,
                "vs_best_static": cell["tok_s_mean"] / statics[best],
                "noise": _noise(cell, static[best]["phases"][phase]),
            }
        decode = {n: p["phases"][phase].get("decode_tok_s_mean") for n, p in static.items()}
        decode = {n: v for n, v in decode.items() if v}
        if decode and cell.get("decode_tok_s_mean"):
            best = max(decode, key=lambda n: decode[n])
            entry["decode_best_static"] = best
            entry["decode_vs_best_static"] = cell["decode_tok_s_mean"] / decode[best]
        if "no-spec" in policies:
            plain = policies["no-spec"]["phases"][phase]["tok_s_mean"]
            entry["vs_no_spec"] = cell["tok_s_mean"] / plain
        per_phase[phase] = entry
    out["phases"] = per_phase
    return out


def read_report(path: Path) -> dict[str, Any]:
    """One call's JSON (``bench/gpu_decisions.py --out``), plain or gzipped: the raw calls are
    committed as ``.json.gz`` (their per-step timelines; bench/results/gpu_decisions/)."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    report: dict[str, Any] = json.loads(data)
    return report


# What each call measured of its engine at start-up (its cost profile): kept per call, not
# part of what makes two calls one arm.
_MEASURED = ("cost_table_ms", "cost_buckets_ms")


def _setup(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report["arm_info"].items() if k not in _MEASURED}


def _profiles(group: list[dict[str, Any]]) -> dict[str, Any]:
    """Each call's start-up cost profile (ms by batch size and width, and by batch size and
    token count), where the calls measured one."""
    if not any(key in r["arm_info"] for r in group for key in _MEASURED):
        return {}
    return {
        "cost_profile_ms_by_call": [
            {key: r["arm_info"][key] for key in _MEASURED if key in r["arm_info"]} for r in group
        ]
    }


def merge(paths: Sequence[Path]) -> dict[str, Any]:
    """The results file from one JSON per arm (each arm's own command kept with it). Several
    files of one arm (calls that added repeats of the same requests) pool their runs; they must
    agree on the phases and the arm. ``PATH=NAME`` counts a file under the arm name NAME (runs
    of one arm made on different days or machines are kept apart, not pooled)."""
    reports: dict[str, list[dict[str, Any]]] = {}
    engines: dict[str, list[str]] = {}  # engine -> the files that ran on it
    for given in paths:
        text, _, label = str(given).partition("=")
        report = read_report(Path(text))
        reports.setdefault(label or report["arm"], []).append(report)
        # Files from before ``--verify-mode`` ran on the padded engine.
        engines.setdefault(report.get("engine", "padded"), []).append(text)
    if len(engines) > 1:
        found = "; ".join(f"{engine}: {', '.join(files)}" for engine, files in engines.items())
        raise ValueError(
            f"the files ran on different engines ({found}); the results file holds one engine "
            '(its top-level "engine"): merge each engine\'s files separately'
        )
    arms: dict[str, Any] = {}
    for arm, group in reports.items():
        first = group[0]
        for other in group[1:]:
            if other["phases"] != first["phases"] or _setup(other) != _setup(first):
                raise ValueError(f"arm {arm}: the files differ in phases or arm; cannot pool")
        runs = [
            {**run, "call": call} for call, report in enumerate(group) for run in report["runs"]
        ]
        names = list(dict.fromkeys(run["policy"] for run in runs))
        summary = summarise(runs, names)
        arms[arm] = {
            "command": "; ".join(r["command"] for r in group),
            "device": first["device"],
            "calls": len(group),
            "policies": summary["policies"],
            "ratios": summary["ratios"],
            **({"exactness": first["exactness"]} if "exactness" in first else {}),
            **_profiles(group),
        }
    commands = "; ".join(a["command"] for a in arms.values())
    (engine,) = engines
    return {"engine": engine, "command": commands, "arms": arms}
