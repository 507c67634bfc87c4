#!/usr/bin/env bash
# Written by draftctl plan: one server per line.
# pool all (k = 7 at every batch size)
python -m sglang.launch_server --model-path TARGET --served-model-name model --host 127.0.0.1 --port 8101 --max-running-requests 128 --speculative-algorithm DFLASH --speculative-draft-model-path DRAFT --speculative-num-draft-tokens 8 &
# pool all (k = 7 at every batch size)
python -m sglang.launch_server --model-path TARGET --served-model-name model --host 127.0.0.1 --port 8102 --max-running-requests 128 --speculative-algorithm DFLASH --speculative-draft-model-path DRAFT --speculative-num-draft-tokens 8 &
# pool all (k = 7 at every batch size)
python -m sglang.launch_server --model-path TARGET --served-model-name model --host 127.0.0.1 --port 8103 --max-running-requests 128 --speculative-algorithm DFLASH --speculative-draft-model-path DRAFT --speculative-num-draft-tokens 8 &
# pool all (k = 7 at every batch size)
python -m sglang.launch_server --model-path TARGET --served-model-name model --host 127.0.0.1 --port 8104 --max-running-requests 128 --speculative-algorithm DFLASH --speculative-draft-model-path DRAFT --speculative-num-draft-tokens 8 &
wait
