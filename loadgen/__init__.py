"""``draftctl bench``: drive an OpenAI-compatible endpoint with real prompts, closed loop.

An offline tool beside the daemon (like sim/): it may import controller, engines and policies;
the daemon never imports it.
"""

DEFAULT_DATASETS = "gsm8k,math500,humaneval,mbpp,mt-bench"
PACKAGED_DATASETS = "humaneval,mt-bench"  # in the installed data packages: no --data-dir
