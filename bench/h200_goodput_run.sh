#!/usr/bin/env bash
# One H200 device call: static k vs goodput vs no-spec on the embedded engine with the testbed pair.
#
#   1. trains the testbed pair (training/configs/testbed.yaml, block-16 draft only, every time
#      budget x TIME_SCALE) from the carried tokenizer and corpus;
#   2. profiles this target's verify cost T(batch, tokens) (`draftctl profile-cost`, CUDA graphs)
#      -> the goodput policy's cost table;
#   3. runs bench/gpu_decisions.py --arm real-pair with it (every policy on the same seeded
#      requests: no-spec, static k, dsd-schedule, vllm-av, goodput; greedy exactness check on
#      EXACTNESS prompts, default 256, 0 = skip);
#      VERIFY_MODE=ragged runs the arm on ragged verifies (the exactness check's per-row and
#      two-phase settings then check ragged against plain decoding on this trained pair);
#      LABEL names the arm, POLICIES picks the policies (bench/gpu_decisions.py --help),
#      COMPILE_SCOPE=layer runs the arm on torch.compile'd forwards (regional);
#      ATTENTION=triton on the split-KV Triton attention (engines/embedded/decode_attention.py);
#      SPEC_BURST=4 PLAIN_BURST=4 at the engine's CUDA bursts (the harness runs 1 by default),
#      PLAIN_CHAIN=1 chains the plain bursts (--plain-chain, Engine(plain_chain=True); with
#      CUDA_DEFAULTS=1 they chain anyway since session 46, PLAIN_CHAIN=0 then leaves it out:
#      --no-plain-chain);
#      WARM_POLICIES=1 gives each policy a warm pass (--warm-policies), as the 8B arm runs;
#      CUDA_DEFAULTS=1 every kernel, burst and pricing setting of the engine's CUDA defaults
#      (--cuda-defaults; the variables above still win where set); ORDER_SEED the runs' random
#      order (--order-seed; unset: the harness's seed, the same order every call);
#   4. with CONFIDENCE_S seconds kept for it (default 0 = skip): bench/draft_confidence.py on
#      the pair (how well the draft's confidence predicts acceptance: issue 16's calibration).
# A pair already exported in $WORK/export (same machine, earlier call) is reused, not retrained.
# Results land in $OUT as they are made (a stopped run keeps what it finished):
#   goodput_h200.log, train_testbed.json, cost_table_testbed.json, real-pair.json (gzipped
#   once the bench ends: unzipped it outgrew what a device call brings back, session 45).
#
# On the GPU (device tool `run`; carry .train/demo/tokenizer .train/demo/corpus
# .train/eval_prompts.json .whl):
#   bash bench/h200_goodput_run.sh
# The carry (64 MiB with the tracked tree, ~44 MiB of it) holds the corpus only with its
# train.bin (uint16 token ids, documents shuffled) cut; session 36 kept the first 6 M tokens,
# session 44 3.5 M, session 47 3 M (the tracked tree had grown; the target trains on ~14 M tokens a call):
#   python3 -c "import numpy as n; f='.train/demo/corpus/train.bin'; n.fromfile(f, n.uint16)[:3_000_000].tofile(f)"
# CPU dry run (TINY=1: a toy-sized recipe derived from RECIPE, short phases, the 8B table as a
# stand-in cost table; the numbers mean nothing, it checks that every step runs):
#   OUT=/tmp/dry DEVICE=cpu PY=.venv/bin/python TINY=1 bash bench/h200_goodput_run.sh
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:?set OUT to the results folder}
RECIPE=${RECIPE:-training/configs/testbed.yaml}
TIME_SCALE=${TIME_SCALE:-0.3}
DEVICE=${DEVICE:-cuda}
BUDGET_S=${BUDGET_S:-420}          # wall clock for this whole script
TINY=${TINY:-0}
COST_TABLE=${COST_TABLE:-}         # empty: profile this target (CUDA)
WORK=${WORK:-/tmp/h200_testbed}
PY=${PY:-python3}
LOG=$OUT/goodput_h200.log
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10
mkdir -p "$OUT" "$WORK"
say() { echo "[h200_goodput_run +$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }

if [ "$DEVICE" = cuda ] && [ -d .whl ]; then  # pydantic & co. are not in the GPU image
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || say "wheel install failed"
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$LOG" 2>&1
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tee -a "$LOG"

if [ "$TINY" = 1 ]; then  # toy sizes and budgets: a CPU check that every step runs
  "$PY" - "$RECIPE" "$WORK/recipe_tiny.yaml" <<'EOF'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d["target"].update(hidden_size=64, num_layers=2, intermediate_size=128, num_heads=4,
                   num_kv_heads=2, head_dim=16)
d["target_train"].update(batch_size=8, seq_len=128, warmup_steps=5, time_budget_s=15.0)
d["generation"].update(time_budget_s=8.0, batch_size=16, max_new_tokens=48)
d["corpus"]["num_generation_prompts"] = 64
d["draft"]["num_layers"] = 1
d["draft"]["num_anchors"] = 8
d["draft"]["train"].update(batch_size=8, seq_len=128, warmup_steps=5, time_budget_s=10.0)
d["draft"]["block_sizes"] = [16]
yaml.safe_dump(d, open(sys.argv[2], "w"), default_flow_style=None, sort_keys=False)
EOF
  RECIPE=$WORK/recipe_tiny.yaml TIME_SCALE=1 SCALE=0.05 REPEATS=1
  COST_TABLE=${COST_TABLE:-cost_tables/qwen3-8b-h200.json}
fi

# 1. the testbed pair (block 16 only: the bench needs k up to 15; one draft gets all draft steps)
ln -sfn "$PWD/.train/demo/tokenizer" "$WORK/tokenizer"
ln -sfn "$PWD/.train/demo/corpus" "$WORK/corpus"
if [ -f "$WORK/export/train.json" ] && [ -d "$WORK/export/draft16" ]; then
  say "reusing the pair in $WORK/export"
else
  sed 's/^\(  block_sizes:\).*/\1 [16]/' "$RECIPE" >"$WORK/recipe.yaml"
  say "training: $RECIPE (block_sizes [16]) --time-scale $TIME_SCALE"
  "$PY" -m training pair --recipe "$WORK/recipe.yaml" --work "$WORK" --out "$WORK/export" \
    --time-scale "$TIME_SCALE" 2>&1 | tr '\r' '\n' | grep -v '^ *$' >>"$LOG"
fi
[ -f "$WORK/export/train.json" ] || { say "training failed (see log)"; exit 1; }
cp "$WORK/export/train.json" "$OUT/train_testbed.json"
"$PY" - "$OUT/train_testbed.json" <<'EOF' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
t, b = d["target"], d["drafts"]["block16"]
print("trained: target", t["steps"], "steps, val_loss", t["val_loss"], "| draft16", b["steps"],
      "steps,", b["final"], "| total", d["total_time_s"], "s")
EOF

# 3. prompts: held-out sources -> tasks (JSONL of {task, prompt} for the harness)
"$PY" - .train/eval_prompts.json "$WORK/prompts.jsonl" <<'EOF'
import json, sys
tasks = {"gsm8k-test": "math", "math500": "math", "humaneval": "code", "mbpp-test": "code",
         "mt-bench": "chat", "sharegpt-heldout": "chat"}
with open(sys.argv[2], "w") as out:
    for source, prompts in json.load(open(sys.argv[1])).items():
        for p in prompts:
            out.write(json.dumps({"task": tasks[source], "source": source, "prompt": p}) + "\n")
EOF

# 4. every policy on this pair (bench/gpu_decisions.py, real-pair arm: greedy exactness check,
#    the pair's own acceptance, its profiled cost table), in the time left
CONFIDENCE_S=${CONFIDENCE_S:-0}
LEFT=$((BUDGET_S - $(date +%s) + T0 - 20 - CONFIDENCE_S))
say "bench: real-pair arm, ${LEFT}s left"
CHAIN_FLAG=()  # PLAIN_CHAIN unset: the arm's default; 0: --no-plain-chain; else --plain-chain
case "${PLAIN_CHAIN:-}" in "") ;; 0) CHAIN_FLAG=(--no-plain-chain) ;; *) CHAIN_FLAG=(--plain-chain) ;; esac
"$PY" bench/gpu_decisions.py --arm real-pair --target "$WORK/export/target" \
  --draft "$WORK/export/draft16" --prompts "$WORK/prompts.jsonl" --device "$DEVICE" \
  --scale "${SCALE:-0.5}" --repeats "${REPEATS:-3}" --budget-s "$LEFT" \
  --exactness-prompts "${EXACTNESS:-256}" --verify-mode "${VERIFY_MODE:-padded}" \
  ${LABEL:+--label "$LABEL"} ${POLICIES:+--policies "$POLICIES"} \
  ${COMPILE_SCOPE:+--compile-scope "$COMPILE_SCOPE"} ${ATTENTION:+--attention "$ATTENTION"} \
  ${COST_TABLE:+--cost-table "$COST_TABLE"} ${SPEC_BURST:+--spec-burst "$SPEC_BURST"} \
  ${PLAIN_BURST:+--plain-burst "$PLAIN_BURST"} "${CHAIN_FLAG[@]}" ${WARM_POLICIES:+--warm-policies} \
  ${CUDA_DEFAULTS:+--cuda-defaults} ${ORDER_SEED:+--order-seed "$ORDER_SEED"} \
  --out "$OUT/real-pair.json" 2>>"$LOG" | tee -a "$LOG"
RC=${PIPESTATUS[0]}
say "bench exit $RC"
[ -f "$OUT/real-pair.json" ] && gzip -f "$OUT/real-pair.json"

# 5. the draft's confidence against acceptance on this pair (issue 16)
if [ "$CONFIDENCE_S" -gt 0 ]; then
  say "draft confidence: ${CONFIDENCE_S}s kept"
  timeout "$CONFIDENCE_S" "$PY" bench/draft_confidence.py --target "$WORK/export/target" \
    --draft "$WORK/export/draft16" --prompts .train/eval_prompts.json --device "$DEVICE" \
    --prompts-per-source "${CONFIDENCE_PROMPTS:-40}" --batch 16 \
    --out "$OUT/draft_confidence.json" 2>>"$LOG" | tee -a "$LOG"
  say "draft confidence exit ${PIPESTATUS[0]}"
fi
exit $RC
