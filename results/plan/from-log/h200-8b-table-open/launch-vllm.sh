#!/usr/bin/env bash
# Written by draftctl plan: one server per line.
# pool all
python -m vllm.entrypoints.openai.api_server --model TARGET --served-model-name model --host 127.0.0.1 --port 8101 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"DRAFT","num_speculative_tokens":7}' --per-request-spec-decode-metrics summary &
# pool all
python -m vllm.entrypoints.openai.api_server --model TARGET --served-model-name model --host 127.0.0.1 --port 8102 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"DRAFT","num_speculative_tokens":7}' --per-request-spec-decode-metrics summary &
# pool all
python -m vllm.entrypoints.openai.api_server --model TARGET --served-model-name model --host 127.0.0.1 --port 8103 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"DRAFT","num_speculative_tokens":7}' --per-request-spec-decode-metrics summary &
# pool all
python -m vllm.entrypoints.openai.api_server --model TARGET --served-model-name model --host 127.0.0.1 --port 8104 --max-num-seqs 128 --speculative-config '{"method":"dflash","model":"DRAFT","num_speculative_tokens":7}' --per-request-spec-decode-metrics summary &
wait
