"""Policy documents the tests edit: the static table, as it was the default before goodput.

Tests that check static routing, YAML problems at fixed lines or table edits start from this
text; the daemon's own default (``controller.policy.document.DEFAULT_POLICY_TEXT``, goodput)
is what first starts write.
"""

STATIC_POLICY_TEXT = """\
# draftctl policy. k = drafted tokens verified per step; 0 = drafting off.
kind: static
min_spec_tokens: 4          # smallest non-zero k any decision may use
static:
  # Inclusive upper edges of the concurrency bands: 1-8, 9-32, 33-64, >64.
  concurrency_bands: [8, 32, 64]
  # One k per band; "max" = max_spec_tokens (default: the draft's block size - 1).
  spec_tokens:
    math: [max, max, 7, 4]
    code: [max, max, 7, 4]
    chat: [7, 4, 4, 0]
"""
