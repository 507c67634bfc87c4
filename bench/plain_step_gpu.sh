#!/usr/bin/env bash
# One H200 device call for the plain step's two levers (issue 16, session 27; both off by
# default until this measures them; docs/engine.md "The few-token linear kernel" and
# "Deferred draft context at k = 0"):
#
#   1. bench/gemv_gpu.py: every decode matrix of the 8B shape at 1, 2, 8 and 16 tokens, the
#      few-token kernel (autotuned) against F.linear (cuBLAS), and every block configuration
#      on its own (to trim gemv.CONFIGS) -> $OUT/gemv_gpu.json;
#   2. bench/decode_gpu.py with the eager reference and four compiled runners (layer scope,
#      Triton attention): aten / gemv linear layers x the draft's context inserted / deferred
#      -> $OUT/decode_gpu.json (the batch-1/8/64 plain step against the floor, the target-only
#      forward, the engine step at k = 0 and 15, the stashing graph and the stash insert).
#
# On the GPU (device tool `run`, carry .whl, prefix as README "GPU runs" shows):
#   OUT=$OUT bash bench/plain_step_gpu.sh
# Skip a part: GEMV=0 or DECODE=0. PY picks the interpreter (default python3).
set -uo pipefail
OUT=${OUT:?set OUT to the results folder}
PY=${PY:-python3}
mkdir -p "$OUT"
status=0
if [ "${GEMV:-1}" = 1 ]; then
  timeout "${GEMV_TIMEOUT_S:-180}" "$PY" bench/gemv_gpu.py --shapes qwen3-8b --every-config \
    --out "$OUT/gemv_gpu.json" > "$OUT/gemv_gpu.log" 2>&1 || status=$?
  echo "gemv_gpu: exit $status"; tail -n 3 "$OUT/gemv_gpu.log"
fi
if [ "${DECODE:-1}" = 1 ]; then
  timeout "${DECODE_TIMEOUT_S:-400}" "$PY" bench/decode_gpu.py --out-dir "$OUT" \
    --shapes qwen3-8b --compile-scope layer --attention triton --linear aten,gemv \
    --context insert,defer --compiled-only > "$OUT/decode_gpu.log" 2>&1 || status=$?
  echo "decode_gpu: exit $status"; tail -n 3 "$OUT/decode_gpu.log"
fi
exit $status
