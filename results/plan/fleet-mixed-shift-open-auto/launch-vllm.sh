#!/usr/bin/env bash
# Written by draftctl plan: one server per line.
# pool math
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8101 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":15,"num_speculative_tokens_per_batch_size":[[1,8,15],[9,9,14],[10,11,13],[12,13,12],[14,16,11],[17,19,10],[20,25,9],[26,33,8],[34,80,7],[81,128,6]]}' --per-request-spec-decode-metrics summary &
# pool math
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8102 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":15,"num_speculative_tokens_per_batch_size":[[1,8,15],[9,9,14],[10,11,13],[12,13,12],[14,16,11],[17,19,10],[20,25,9],[26,33,8],[34,80,7],[81,128,6]]}' --per-request-spec-decode-metrics summary &
# pool code
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8103 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":14,"num_speculative_tokens_per_batch_size":[[1,6,14],[7,7,13],[8,9,12],[10,10,11],[11,13,10],[14,17,9],[18,21,8],[22,44,7],[45,71,6],[72,128,5]]}' --per-request-spec-decode-metrics summary &
# pool code
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8104 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":14,"num_speculative_tokens_per_batch_size":[[1,6,14],[7,7,13],[8,9,12],[10,10,11],[11,13,10],[14,17,9],[18,21,8],[22,44,7],[45,71,6],[72,128,5]]}' --per-request-spec-decode-metrics summary &
# pool chat
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8105 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":13,"num_speculative_tokens_per_batch_size":[[1,1,13],[2,4,12],[5,5,11],[6,6,10],[7,8,9],[9,11,8],[12,19,7],[20,28,6],[29,44,5],[45,89,4],[90,128,3]]}' --per-request-spec-decode-metrics summary &
# pool chat
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8106 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":13,"num_speculative_tokens_per_batch_size":[[1,1,13],[2,4,12],[5,5,11],[6,6,10],[7,8,9],[9,11,8],[12,19,7],[20,28,6],[29,44,5],[45,89,4],[90,128,3]]}' --per-request-spec-decode-metrics summary &
wait
