"""The GPU-decisions harness (bench/gpu_decisions.py): workload, policies, closed-loop driver."""
