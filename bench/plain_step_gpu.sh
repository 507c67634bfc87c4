#!/usr/bin/env bash
# One H200 device call for the plain step (issue 16; docs/engine.md "The few-token linear
# kernel" and "Deferred draft context at k = 0"). Session 27 wrote it for the two levers then
# off by default; session 28 measured them (both now the defaults on CUDA) and added part 3:
#
#   1. bench/gemv_gpu.py: every decode matrix of the 8B shape at 1, 2, 8 and 16 tokens, the
#      few-token kernel against F.linear (cuBLAS), its fused parts against the unfused, and
#      every candidate block configuration on its own -> $OUT/gemv_gpu.json;
#   2. bench/decode_gpu.py with the eager reference and the compiled runners (layer scope,
#      Triton attention): aten / gemv / fused linear layers x the draft's context inserted /
#      deferred -> $OUT/decode_gpu.json (the batch-1/8/64 plain step against the floor, the
#      target-only forward, the engine step at k = 0 and 15, the stashing graph, the insert);
#   3. bench/plain_step_trace.py at batch 1 and 64 (TRACE_BATCHES): where the engine's plain
#      step spends the time outside its graph (0.46-0.68 ms a batch-1 step in session 28),
#      then plain bursts of 1, 4 and 8 steps per host round trip timed in 5 rounds of random
#      order (session 29) -> $OUT/plain_step_trace_b{1,64}.json and a gzip Chrome trace of
#      batch 1;
#   4. the same at k = 15 (drafting bursts, Engine.spec_burst) at batch 1 (SPEC_BATCHES) ->
#      $OUT/spec_step_trace_b1.json.
#
# On the GPU (device tool `run`, carry .whl, the pip prefix docs/goodput.md shows before its harness commands):
#   OUT=$OUT bash bench/plain_step_gpu.sh
# Skip a part: GEMV=0, DECODE=0, TRACE=0 or SPEC=0; LINEAR and CONTEXT pick decode_gpu's runners
# (default aten,fused and defer); TRACE_BATCHES the trace's batch sizes. PY picks the interpreter (default python3).
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
    --shapes qwen3-8b --compile-scope layer --attention triton --linear "${LINEAR:-aten,fused}" \
    --context "${CONTEXT:-defer}" --compiled-only > "$OUT/decode_gpu.log" 2>&1 || status=$?
  echo "decode_gpu: exit $status"; tail -n 3 "$OUT/decode_gpu.log"
fi
if [ "${TRACE:-1}" = 1 ]; then
  for batch in ${TRACE_BATCHES:-1 64}; do
    trace=()
    [ "$batch" = 1 ] && trace=(--trace "$OUT/plain_step_trace_b1.json.gz")
    timeout "${TRACE_TIMEOUT_S:-200}" "$PY" bench/plain_step_trace.py --batch "$batch" \
      --out "$OUT/plain_step_trace_b$batch.json" "${trace[@]}" \
      > "$OUT/plain_step_trace_b$batch.log" 2>&1 || status=$?
    echo "plain_step_trace b$batch: exit $status"; tail -n 1 "$OUT/plain_step_trace_b$batch.log"
  done
fi
if [ "${SPEC:-1}" = 1 ]; then
  for batch in ${SPEC_BATCHES:-1}; do
    timeout "${TRACE_TIMEOUT_S:-200}" "$PY" bench/plain_step_trace.py --batch "$batch" --k 15 \
      --out "$OUT/spec_step_trace_b$batch.json" > "$OUT/spec_step_trace_b$batch.log" 2>&1 \
      || status=$?
    echo "spec_step_trace b$batch: exit $status"; tail -n 1 "$OUT/spec_step_trace_b$batch.log"
  done
fi
exit $status
