#!/usr/bin/env bash
# Written by draftctl plan: one server per line.
# pool math (k = 15 at every batch size)
python -m sglang.launch_server --model-path Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8101 --max-running-requests 128 --speculative-algorithm DFLASH --speculative-draft-model-path z-lab/Qwen3-8B-DFlash-b16 --speculative-num-draft-tokens 16 &
# pool math (k = 15 at every batch size)
python -m sglang.launch_server --model-path Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8102 --max-running-requests 128 --speculative-algorithm DFLASH --speculative-draft-model-path z-lab/Qwen3-8B-DFlash-b16 --speculative-num-draft-tokens 16 &
# pool code (k = 14 at every batch size)
python -m sglang.launch_server --model-path Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8103 --max-running-requests 128 --speculative-algorithm DFLASH --speculative-draft-model-path z-lab/Qwen3-8B-DFlash-b16 --speculative-num-draft-tokens 15 &
# pool code (k = 14 at every batch size)
python -m sglang.launch_server --model-path Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8104 --max-running-requests 128 --speculative-algorithm DFLASH --speculative-draft-model-path z-lab/Qwen3-8B-DFlash-b16 --speculative-num-draft-tokens 15 &
# pool chat (k = 13 at every batch size)
python -m sglang.launch_server --model-path Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8105 --max-running-requests 128 --speculative-algorithm DFLASH --speculative-draft-model-path z-lab/Qwen3-8B-DFlash-b16 --speculative-num-draft-tokens 14 &
# pool chat (k = 13 at every batch size)
python -m sglang.launch_server --model-path Qwen/Qwen3-8B --served-model-name qwen3-8b --host 127.0.0.1 --port 8106 --max-running-requests 128 --speculative-algorithm DFLASH --speculative-draft-model-path z-lab/Qwen3-8B-DFlash-b16 --speculative-num-draft-tokens 14 &
wait
