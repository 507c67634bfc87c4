"""The policy document as text: the default, the size limit, and bytes decoded to text.

Every way in (the admin API's body, the live file, ``config check``) decodes its bytes here,
so a body the API refuses is a file the watcher refuses too.
"""

from __future__ import annotations

from policies.validation import InvalidDocument, Problem

# A policy is a few hundred bytes; this bounds what one edit may make the daemon parse.
MAX_POLICY_BYTES = 256 * 1024

DEFAULT_POLICY_TEXT = """\
# draftctl policy. k = drafted tokens verified per step; 0 = drafting off.
# goodput: k from live acceptance (per task, per draft position) and the step cost, which the
# embedded engine measures at start-up; static: the table below. docs/goodput.md has every key.
kind: goodput
min_spec_tokens: 4          # smallest non-zero k any decision may use
goodput: {}                 # every key at its default
static:
  # Inclusive upper edges of the concurrency bands: 1-8, 9-32, 33-64, >64.
  concurrency_bands: [8, 32, 64]
  # One k per band; "max" = max_spec_tokens (default: the draft's block size - 1).
  spec_tokens:
    math: [max, max, 7, 4]
    code: [max, max, 7, 4]
    chat: [7, 4, 4, 0]
"""


def decode_policy(data: bytes) -> str:
    """UTF-8 text of a policy document; raises InvalidDocument naming what is wrong."""
    if len(data) > MAX_POLICY_BYTES:
        message = f"the policy is {len(data)} bytes, over the limit of {MAX_POLICY_BYTES}"
        raise InvalidDocument([Problem("", message)])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        message = f"the policy is not UTF-8 text (bad byte at offset {exc.start})"
        raise InvalidDocument([Problem("", message)]) from exc


def check_text(text: str) -> None:
    """Refuse an empty or over-size document (an empty file is never a policy)."""
    if not text.strip():
        message = "the policy is empty; send a YAML document such as 'kind: static'"
        raise InvalidDocument([Problem("", message)])
    num_bytes = len(text.encode("utf-8", errors="surrogatepass"))
    if num_bytes > MAX_POLICY_BYTES:
        message = f"the policy is {num_bytes} bytes, over the limit of {MAX_POLICY_BYTES}"
        raise InvalidDocument([Problem("", message)])
