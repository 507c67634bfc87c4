#!/usr/bin/env bash
# Re-creates every file in results/sim/ (JSON report, text table, plots for the mixed traces).
# Run from the repository root: bash results/sim/run.sh   (~3 min on a 2-core CPU)
set -euo pipefail
out=results/sim
for name in mixed-shift mixed-shift-reference mixed-shift-b16 mixed-shift-32b mixed-shift-ragged mixed-shift-host-overhead \
    mixed-shift-parametric mixed-shift-parametric-heterogeneous task-split mixed-shift-ragged-8b; do
  .venv/bin/draftctl simulate --scenario "scenarios/$name.yaml" --no-progress \
    --out "$out/$name.json" --plot "$out" > "$out/$name.txt"
done
.venv/bin/draftctl simulate --scenario scenarios/mixed-shift-ragged-8b-min1.yaml --no-progress \
  --out "$out/mixed-shift-ragged-8b-min1.json" > "$out/mixed-shift-ragged-8b-min1.txt"
# The two-phase wait (session 15), narrow draft graphs and two-phase drafts capped at 7
# (session 16): docs/allocator.md.
# ... and allocation on the device, calibrated to session 20's H200 measurements.
for name in mixed-shift-ragged-8b-two-phase-wait mixed-shift-ragged-8b-narrow-draft \
    mixed-shift-ragged-8b-narrow-draft-cap7 mixed-shift-ragged-8b-device \
    mixed-shift-ragged-8b-device-cap7; do
  .venv/bin/draftctl simulate --scenario "scenarios/$name.yaml" --no-progress \
    --out "$out/$name.json" > "$out/$name.txt"
done
# The files of the ragged scenarios above were made by the allocator with the fixed history
# offset (before commit 343d992, docs/ragged-log.md "Session 22"); re-running them now gives the learnt
# recency term's figures, as this file does for the device scenario (allocator 4,016 ->
# 4,010 tok/s, goodput-auto 3,993 -> 3,989):
.venv/bin/draftctl simulate --scenario scenarios/mixed-shift-ragged-8b-device.yaml --no-progress \
  --out "$out/mixed-shift-ragged-8b-device-recency.json" \
  > "$out/mixed-shift-ragged-8b-device-recency.txt"
# Session 23: the allocator's bounds kept within its budget (allocator 4,010 -> 3,992 tok/s on
# this smooth table, which has no GPU stairs), and the same scenario with min_spec_tokens 1
# (allocator 4,039, vllm-av 4,038; docs/ragged-log.md "Session 23"):
.venv/bin/draftctl simulate --scenario scenarios/mixed-shift-ragged-8b-device.yaml --no-progress \
  --out "$out/mixed-shift-ragged-8b-device-s23.json" > "$out/mixed-shift-ragged-8b-device-s23.txt"
.venv/bin/draftctl simulate --scenario scenarios/mixed-shift-ragged-8b-device-kmin1.yaml \
  --no-progress --out "$out/mixed-shift-ragged-8b-device-kmin1.json" \
  > "$out/mixed-shift-ragged-8b-device-kmin1.txt"
# Session 24: the bounded allocator's budget rule weighs what the bound can spend
# (slot_scoring.bounded_budget): allocator 3,992 -> 4,018 tok/s (docs/ragged-log.md "Session 24"):
.venv/bin/draftctl simulate --scenario scenarios/mixed-shift-ragged-8b-device.yaml --no-progress \
  --out "$out/mixed-shift-ragged-8b-device-s24.json" > "$out/mixed-shift-ragged-8b-device-s24.txt"
# and with two-phase steps from 8 rows (goodput-auto 3,997 -> 4,006; c8-chat 3,169 -> 3,195):
.venv/bin/draftctl simulate --scenario scenarios/mixed-shift-ragged-8b-device-min8.yaml \
  --no-progress --out "$out/mixed-shift-ragged-8b-device-min8.json" \
  > "$out/mixed-shift-ragged-8b-device-min8.txt"
# Session 52: the auto step mode's cut on (goodput.mode_cut_ratio 0.75, off by default):
# goodput-auto 3,997 -> 3,995 tok/s, the rest unchanged (two-phase never loses by far here;
# docs/ragged-log.md "Session 52"):
.venv/bin/draftctl simulate --scenario scenarios/mixed-shift-ragged-8b-device-cut.yaml \
  --no-progress --out "$out/mixed-shift-ragged-8b-device-cut.json" \
  > "$out/mixed-shift-ragged-8b-device-cut.txt"
for task in math code chat; do
  for c in 1 8 64; do
    name=steady-$task-c$c
    .venv/bin/draftctl simulate --scenario "scenarios/$name.yaml" --no-progress \
      --out "$out/$name.json" > "$out/$name.txt"
  done
done
# Fleets (issue #20; docs/fleet.md): ~5-10 min on a 2-core CPU; then the seed spread.
.venv/bin/draftctl simulate --scenario scenarios/fleet-mixed-shift.yaml --no-progress \
  --out "$out/fleet-mixed-shift.json" --plot "$out" > "$out/fleet-mixed-shift.txt"
cp "$out/fleet-mixed-shift-phases.png" docs/fleet.png
.venv/bin/draftctl simulate --scenario scenarios/fleet-mixed-shift-padded8.yaml --no-progress \
  --out "$out/fleet-mixed-shift-padded8.json" > "$out/fleet-mixed-shift-padded8.txt"
PYTHONPATH=. .venv/bin/python results/sim/fleet_seeds.py > "$out/fleet-mixed-shift-seeds.json"
# spill_margin chosen on other traffic (docs/fleet.md "Spill margin"; ~30 s).
.venv/bin/draftctl simulate --scenario scenarios/fleet-spill-tuning.yaml --no-progress \
  --out "$out/fleet-spill-tuning.json" > "$out/fleet-spill-tuning.txt"
# Ragged servers beside the padded fleets (~8 min): docs/fleet.md "Against ragged servers".
.venv/bin/draftctl simulate --scenario scenarios/fleet-mixed-shift-ragged.yaml --no-progress \
  --out "$out/fleet-mixed-shift-ragged.json" > "$out/fleet-mixed-shift-ragged.txt"
# Session 27: the ragged task pools with the spill margin chosen on other traffic (spill 1,
# added to the scenario above), over seeds 1-5 (~30 min): docs/fleet.md "Against ragged servers".
PYTHONPATH=. .venv/bin/python results/sim/fleet_seeds.py \
  --scenario scenarios/fleet-mixed-shift-ragged.yaml \
  --keep uniform-no-spec,uniform-static-k5,uniform-static-k7,uniform-schedule,draftctl-routed-ragged-spill1 \
  > "$out/fleet-mixed-shift-ragged-seeds.json"
# Session 30 (docs/fleet.md "Open-loop traffic", "Against ragged servers"): the trace as
# open-loop arrival rates (~3 min), and task pools of vLLM-AV ragged servers (~2.5 min).
.venv/bin/draftctl simulate --scenario scenarios/fleet-mixed-shift-open.yaml --no-progress \
  --out "$out/fleet-mixed-shift-open.json" > "$out/fleet-mixed-shift-open.txt"
.venv/bin/draftctl simulate --scenario scenarios/fleet-mixed-shift-ragged-av-pools.yaml \
  --no-progress --out "$out/fleet-mixed-shift-ragged-av-pools.json" \
  > "$out/fleet-mixed-shift-ragged-av-pools.txt"
# Seeds 1-5 of the open-loop trace (~5 min; ratios of 1 / mean request latency there).
PYTHONPATH=. .venv/bin/python results/sim/fleet_seeds.py \
  --scenario scenarios/fleet-mixed-shift-open.yaml \
  --keep uniform-no-spec,uniform-static-k5,uniform-static-k7,uniform-schedule,draftctl-routed-spill1,plan-open-auto \
  > "$out/fleet-mixed-shift-open-seeds.json"
# Session 30: the allocator on one-phase ragged steps (prior and history only, no confidence):
# docs/allocator.md "One-phase per-row k (session 30)".
.venv/bin/draftctl simulate --scenario scenarios/mixed-shift-ragged-8b-device-prior.yaml \
  --no-progress --out "$out/mixed-shift-ragged-8b-device-prior.json" \
  > "$out/mixed-shift-ragged-8b-device-prior.txt"
