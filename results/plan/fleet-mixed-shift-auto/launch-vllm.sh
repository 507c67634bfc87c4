#!/usr/bin/env bash
# Written by draftctl plan: one server per line.
# pool all
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8101 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":15,"num_speculative_tokens_per_batch_size":[[1,5,15],[6,7,14],[8,8,13],[9,9,12],[10,11,11],[12,14,10],[15,17,9],[18,21,8],[22,42,7],[43,65,6],[66,121,5],[122,128,4]]}' --per-request-spec-decode-metrics summary &
# pool all
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8102 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":15,"num_speculative_tokens_per_batch_size":[[1,5,15],[6,7,14],[8,8,13],[9,9,12],[10,11,11],[12,14,10],[15,17,9],[18,21,8],[22,42,7],[43,65,6],[66,121,5],[122,128,4]]}' --per-request-spec-decode-metrics summary &
# pool all
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8103 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":15,"num_speculative_tokens_per_batch_size":[[1,5,15],[6,7,14],[8,8,13],[9,9,12],[10,11,11],[12,14,10],[15,17,9],[18,21,8],[22,42,7],[43,65,6],[66,121,5],[122,128,4]]}' --per-request-spec-decode-metrics summary &
# pool all
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8104 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":15,"num_speculative_tokens_per_batch_size":[[1,5,15],[6,7,14],[8,8,13],[9,9,12],[10,11,11],[12,14,10],[15,17,9],[18,21,8],[22,42,7],[43,65,6],[66,121,5],[122,128,4]]}' --per-request-spec-decode-metrics summary &
# pool all
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8105 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":15,"num_speculative_tokens_per_batch_size":[[1,5,15],[6,7,14],[8,8,13],[9,9,12],[10,11,11],[12,14,10],[15,17,9],[18,21,8],[22,42,7],[43,65,6],[66,121,5],[122,128,4]]}' --per-request-spec-decode-metrics summary &
# pool all
python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8106 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"z-lab/Qwen3-8B-DFlash-b16","num_speculative_tokens":15,"num_speculative_tokens_per_batch_size":[[1,5,15],[6,7,14],[8,8,13],[9,9,12],[10,11,11],[12,14,10],[15,17,9],[18,21,8],[22,42,7],[43,65,6],[66,121,5],[122,128,4]]}' --per-request-spec-decode-metrics summary &
wait
