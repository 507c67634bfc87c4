#!/usr/bin/env bash
# Re-creates results/plan/: draftctl plan on the fleet-mixed-shift traffic, routed by task only
# and with load spill (policy spill_margin: the gateway spills through policies.routing.rank_pools).
# Run from the repository root: bash results/plan/run.sh   (~10 min on a 2-core CPU)
set -euo pipefail
args=(--traffic scenarios/fleet-mixed-shift.yaml --instances 6 --model qwen3-8b
      --target Qwen/Qwen3-8B --draft z-lab/Qwen3-8B-DFlash-b16 --no-progress)
.venv/bin/draftctl plan "${args[@]}" --out-dir results/plan/fleet-mixed-shift \
  > results/plan/fleet-mixed-shift.txt
.venv/bin/draftctl plan "${args[@]}" --spill-margin 8 --out-dir results/plan/fleet-mixed-shift-spill8 \
  > results/plan/fleet-mixed-shift-spill8.txt
# Every task-pool layout at spill margins none, 0, 1, 2, 4, 8 (session 25; ~6 times the candidates).
.venv/bin/draftctl plan "${args[@]}" --spill-margin auto --out-dir results/plan/fleet-mixed-shift-auto \
  > results/plan/fleet-mixed-shift-auto.txt
# Session 30: the same traffic as open-loop arrival rates (scenarios/fleet-mixed-shift-open.yaml):
# the plan ranks layouts by mean request latency there.
.venv/bin/draftctl plan --traffic scenarios/fleet-mixed-shift-open.yaml --instances 6 --model qwen3-8b \
  --target Qwen/Qwen3-8B --draft z-lab/Qwen3-8B-DFlash-b16 --no-progress --spill-margin auto \
  --out-dir results/plan/fleet-mixed-shift-open-auto > results/plan/fleet-mixed-shift-open-auto.txt
# Session 30: a served trace the daemon recorded (embedded demo pair, this CPU) planned with
# --traffic-log (bench/plan_from_log.py; --keep-trace plans from the committed trace again).
.venv/bin/python bench/plan_from_log.py --out-dir results/plan/from-log --keep-trace
