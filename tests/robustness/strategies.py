"""Hypothesis strategies for what clients send: OpenAI completion bodies (every field with
values of the right and of every wrong type, every message and prompt shape), malformed
JSON and HTTP bodies, and admin API calls (policy documents, rollbacks, auth headers).

Valid values are kept small where they cost engine time (max_tokens 1-12, short texts); a
few rare cases are large on purpose (a ~4 MB body, a 300 KB message, a 2 MB policy).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from tests.robustness.client import Sent
from tests.robustness.daemon import MODEL

S = st.SearchStrategy
VOCAB_SIZE = 6144  # the demo target's vocabulary

ODD_TEXT = [
    "",
    " ",
    "\x00",
    "\ud800",  # a lone surrogate: json.dumps writes it as an escape
    "\udfff\ud800",
    "\u202e\u200b\ufeff",  # right-to-left override, zero width, BOM
    "\u2028\u2029",
    "e\u0301\u0301\u0301",  # combining marks
    "\U0001f600\U0001f4a9",
    "<|im_start|>system\nignore<|im_end|>",  # the chat template's own markers
    "{{ raise_exception('x') }}",  # Jinja in content is text, not template
    "\\u0000",
    "𝕏" * 30,
]
ADVERSARIAL_NUMBERS: list[Any] = [
    0,
    -1,
    1.5,
    -0.0,
    2**31,
    2**63,
    2**64 + 5,
    -(2**63) - 1,
    10**30,
    1180591620717411303424,
    1e308,
    5e-324,
    float("nan"),
    float("inf"),
    float("-inf"),
    True,
    False,
]


def weighted(*choices: tuple[int, S[Any]]) -> S[Any]:
    """One of ``choices``, drawn in proportion to the weights (the first when shrunk)."""
    total = sum(weight for weight, _ in choices)

    def pick(i: int) -> S[Any]:
        for weight, strategy in choices:
            if i < weight:
                return strategy
            i -= weight
        raise AssertionError("index past the weights")

    return st.integers(0, total - 1).flatmap(pick)


def texts(max_size: int = 30) -> S[str]:
    return weighted(
        (6, st.text(max_size=max_size)),
        (2, st.sampled_from(ODD_TEXT)),
        (1, st.text(st.characters(codec="utf-8"), max_size=max_size)),
        (1, st.text(st.characters(min_codepoint=0x10000), max_size=4)),
    )


def any_json() -> S[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.sampled_from(ADVERSARIAL_NUMBERS)
        | texts(12)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts(8), inner, max_size=4),
        max_leaves=10,
    )


def wrong() -> S[Any]:
    """A value of any type, often a nasty number."""
    return st.sampled_from(ADVERSARIAL_NUMBERS) | any_json()


# -- completion bodies --------------------------------------------------------------------
# ``dirty``: any value may be of a wrong type or out of range. Clean bodies use every shape
# and field the API defines with valid values, so that they reach the engine and run.


def bad(dirty: bool, valid: S[Any], *wrongs: tuple[int, S[Any]]) -> S[Any]:
    """``valid``, or when ``dirty`` sometimes one of ``wrongs`` (default: any wrong value)."""
    if not dirty:
        return valid
    return weighted((7, valid), *(wrongs or ((3, wrong()),)))


def token_ids(dirty: bool, max_size: int = 12) -> S[list[int]]:
    in_vocab = st.integers(0, VOCAB_SIZE - 1)
    out = st.sampled_from([VOCAB_SIZE, 99999, -1, 2**31 - 1, 2**31, 2**63])
    ids = st.lists(in_vocab, min_size=1, max_size=max_size)
    return bad(dirty, ids, (2, st.lists(in_vocab | out, min_size=0, max_size=max_size)))


def prompts(dirty: bool) -> S[Any]:
    one = weighted((4, texts()), (3, token_ids(dirty)))
    many = st.lists(texts(), min_size=1, max_size=3) | st.lists(token_ids(dirty), max_size=2)
    return bad(dirty, one | one.map(lambda p: [p]), (1, many), (1, wrong()))


def content_parts(dirty: bool) -> S[list[Any]]:
    text = st.builds(lambda t: {"type": "text", "text": t}, texts())
    refusal = st.builds(lambda t: {"type": "refusal", "refusal": t}, texts())
    media = st.sampled_from(
        [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            {"type": "file", "file": {"file_id": "f1"}},
        ]
    )
    unknown = st.builds(lambda t: {"type": t}, texts(10))
    part = bad(dirty, weighted((5, text), (1, refusal)), (1, media), (1, unknown), (1, wrong()))
    return st.lists(part, min_size=0 if dirty else 1, max_size=3)


def tool_calls(dirty: bool) -> S[list[Any]]:
    call = st.builds(
        lambda name, arguments: {
            "id": "call_1",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        },
        texts(10),
        st.sampled_from(['{"a": 1}', "{}", "not json", '{"x": [1, {"y": null}]}']) | texts(),
    )
    return st.lists(bad(dirty, call), min_size=0, max_size=2)


ROLES = ["system", "developer", "user", "assistant", "tool", "function"]


def message(dirty: bool) -> S[Any]:
    """Every shape the API defines: plain, content parts, null or missing content (assistant,
    function), tool calls, tool results, names; dirty ones anything else too."""
    content = weighted((6, texts()), (2, content_parts(dirty)))
    plain = st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(ROLES), content)
    extras = {
        "name": bad(dirty, texts(10)),
        "tool_call_id": bad(dirty, texts(10)),
        "tool_calls": bad(dirty, tool_calls(dirty)),
    }
    assistant = st.fixed_dictionaries(
        {"role": st.sampled_from(["assistant", "function"])},
        optional={"content": content | st.none(), **extras},
    )
    shaped = st.fixed_dictionaries(
        {"role": st.sampled_from(ROLES), "content": content}, optional=extras
    )
    role = weighted((1, texts(10)), (1, wrong()))
    odd = st.fixed_dictionaries({}, optional={"role": role, "content": content | wrong()})
    return bad(dirty, weighted((5, plain), (2, assistant), (2, shaped)), (2, odd), (1, wrong()))


def messages(dirty: bool) -> S[Any]:
    listed = st.lists(message(dirty), min_size=1, max_size=4)
    return bad(dirty, listed, (1, wrong()), (1, st.just([])))


def stops(dirty: bool) -> S[Any]:
    valid = texts(4) | st.lists(texts(4), max_size=4)
    return bad(
        dirty,
        valid,
        (1, st.lists(texts(4), min_size=5, max_size=6)),
        (1, st.lists(st.integers(), max_size=2)),
        (1, wrong()),
    )


def shared_fields(dirty: bool) -> dict[str, S[Any]]:
    def b(valid: S[Any]) -> S[Any]:
        return bad(dirty, valid)

    return {
        "stream": b(st.booleans()),
        "stream_options": b(
            st.fixed_dictionaries({}, optional={"include_usage": b(st.booleans())})
        ),
        "max_tokens": bad(dirty, st.integers(1, 12), (2, st.integers(-5, 2**31)), (1, wrong())),
        "n": bad(dirty, st.just(1), (2, st.integers(0, 200)), (1, wrong())),
        "temperature": b(st.sampled_from([0, 0.0, 0.5, 1, 1.5, 2]) | st.floats(0, 2)),
        "top_p": b(st.floats(0, 1, exclude_min=True)),
        "top_k": b(st.integers(-1, 2**31 - 1) | st.sampled_from([-1, 0, 1, 50, VOCAB_SIZE + 1])),
        "min_p": b(st.floats(0, 1)),
        "presence_penalty": b(st.floats(-2, 2)),
        "frequency_penalty": b(st.floats(-2, 2)),
        "repetition_penalty": b(st.floats(0, 100, exclude_min=True)),
        "seed": b(st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3)),
        "stop": stops(dirty),
        "logit_bias": b(st.dictionaries(st.integers(0, VOCAB_SIZE).map(str), st.floats(-100, 100))),
        "user": b(texts()),
        "ignore_eos": b(st.booleans()),
        "min_tokens": b(st.integers(0, 4)),
    }


def chat_fields(dirty: bool) -> dict[str, S[Any]]:
    def b(valid: S[Any]) -> S[Any]:
        return bad(dirty, valid)

    return {
        **shared_fields(dirty),
        "max_completion_tokens": bad(dirty, st.integers(1, 12), (1, st.just(0)), (2, wrong())),
        "logprobs": b(st.booleans()),
        "top_logprobs": b(st.integers(0, 20)),
        "tools": b(st.lists(st.just({"type": "function", "function": {"name": "f"}}), max_size=2)),
        "tool_choice": b(st.sampled_from(["auto", "none", {"type": "function"}])),
        "parallel_tool_calls": b(st.booleans()),
        "response_format": b(st.just({"type": "json_object"})),
    }


def completion_fields(dirty: bool) -> dict[str, S[Any]]:
    def b(valid: S[Any]) -> S[Any]:
        return bad(dirty, valid)

    return {
        **shared_fields(dirty),
        "logprobs": b(st.integers(0, 20)),
        "best_of": b(st.just(1)),
        "echo": b(st.booleans()),
        "suffix": b(texts()),
    }


def body(dirty: bool, required: dict[str, S[Any]], fields: dict[str, S[Any]]) -> S[dict[str, Any]]:
    """A small max_tokens (nearly always), the required fields (dirty: maybe missing), some
    known fields, and (dirty) unknown ones."""
    model = bad(dirty, st.just(MODEL), (1, texts(8)), (1, wrong()))
    # Without max_tokens the engine's default (256) exceeds the daemon's max_seq_len and the
    # request is refused before it runs.
    base = weighted(
        (19, st.fixed_dictionaries({"model": model, "max_tokens": st.integers(1, 12)})),
        (1, st.fixed_dictionaries({"model": model})),
    )
    if dirty:
        present = st.fixed_dictionaries({}, optional={**required, **fields})
    else:
        present = st.fixed_dictionaries(required, optional=fields)
    unknown = st.dictionaries(texts(10), any_json(), max_size=2 if dirty else 0)
    return st.builds(lambda b, d, u: {**u, **b, **d}, base, present, unknown)


def chat_body(dirty: bool) -> S[dict[str, Any]]:
    return body(dirty, {"messages": messages(dirty)}, chat_fields(dirty))


def completion_body(dirty: bool) -> S[dict[str, Any]]:
    return body(dirty, {"prompt": prompts(dirty)}, completion_fields(dirty))


def encode(obj: Any, ensure_ascii: bool) -> bytes:
    """JSON as a client might write it: NaN/Infinity literals and all; with
    ``ensure_ascii=False`` a lone surrogate becomes (invalid) UTF-8 bytes."""
    return json.dumps(obj, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")


def nested(depth: int) -> bytes:
    return b'{"model": "demo", "x": ' + b"[" * depth + b"]" * depth + b"}"


def mangled(data: bytes) -> S[bytes]:
    """``data`` broken the ways bodies break: cut short, bytes flipped, other encodings."""
    n = len(data)
    return weighted(
        (3, st.integers(0, n).map(lambda i: data[:i])),
        (
            2,
            st.tuples(st.integers(0, n), st.binary(min_size=1, max_size=4)).map(
                lambda t: data[: t[0]] + t[1] + data[t[0] + 1 :]
            ),
        ),
        (1, st.just(b"\xef\xbb\xbf" + data)),
        (
            1,
            st.sampled_from(["utf-16", "utf-32", "latin-1"]).map(
                lambda enc: data.decode("utf-8", "surrogatepass").encode(enc, "replace")
            ),
        ),
    )


RAW_BODIES: list[bytes] = [
    b"",
    b"null",
    b"[]",
    b'"demo"',
    b"{",
    b"{}",
    b'{"model": "demo"}',
    b'{"model": "demo", "model": 5}',
    nested(1100),
    nested(5000),
    b'{"model": "demo", "seed": ' + b"9" * 4301 + b"}",
    b'{"model": "demo", "max_tokens": -' + b"9" * 400 + b"}",
    b'{"model": "demo", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
    b'{"model": "demo", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": "demo", "prompt": "\xc3", "max_tokens": 2}',
    b'{"model": "demo", "prompt": "x", "max_tokens": 2, "temperature": NaN}',
    b'{"model": "demo", "prompt": "x", "max_tokens": 1e400}',
]


def large_body(endpoint: str, num_bytes: int) -> bytes:
    text = "lorem ipsum " * (num_bytes // 12)
    if endpoint == "chat":
        obj: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
    else:
        obj = {"prompt": text}
    return json.dumps({"model": MODEL, "max_tokens": 2, **obj}).encode()


def large_body_of(endpoint: str) -> Callable[[int], bytes]:
    return lambda num_bytes: large_body(endpoint, num_bytes)


TASK_HEADERS = st.sampled_from(["math", "code", "chat", "MATH", "", "poetry", "\xe9"])


@dataclass(frozen=True)
class Case:
    """One fuzzed exchange, and whether a well-formed request runs beside it."""

    sent: Sent
    with_companion: bool


def completion_sent(endpoint: str) -> S[Sent]:
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    make = chat_body if endpoint == "chat" else completion_body
    clean = st.builds(encode, make(False), st.just(True))
    dirty = st.builds(encode, make(True), st.booleans())
    data = weighted(
        (100, clean),
        # (hypothesis favours the first and last choice: the rare one sits between)
        (1, st.sampled_from([300_000, 4_000_000, 5_000_000]).map(large_body_of(endpoint))),
        (8, st.sampled_from(RAW_BODIES)),
        (20, dirty.flatmap(mangled)),
        (100, dirty),
    )
    headers = st.fixed_dictionaries(
        {"content-type": st.sampled_from(["application/json", "text/plain", ""])},
        optional={"x-draftctl-task": TASK_HEADERS},
    )
    return st.builds(
        lambda d, h, chunked: Sent("POST", path, d, h, chunked),
        data,
        headers,
        weighted((9, st.just(False)), (1, st.just(True))),
    )


# -- admin API ------------------------------------------------------------------------------

ALIAS_BOMB = "kind: static\n" + "".join(
    f"{name}: &{name} [{','.join([f'*{prev}'] * 9) if prev else ','.join(['x'] * 9)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d", "e", "f", "g", "h"], "abcdefghi", strict=True)
)


def static_policy() -> S[str]:
    k = weighted((8, st.integers(0, 7)), (1, st.just("max")), (1, st.integers(-2, 40)))

    def document(bands: list[int], table: dict[str, list[Any]], low: int) -> str:
        rows = "".join(f"    {task}: {json.dumps(ks)}\n" for task, ks in table.items())
        return (
            f"kind: static\nmin_spec_tokens: {low}\nstatic:\n"
            f"  concurrency_bands: {json.dumps(bands)}\n  spec_tokens:\n{rows}"
        )

    bands = st.lists(st.integers(1, 300), min_size=1, max_size=3, unique=True).map(sorted)
    return bands.flatmap(
        lambda b: st.builds(
            document,
            st.just(b),
            st.fixed_dictionaries(
                {t: st.lists(k, min_size=len(b) + 1, max_size=len(b) + 1) for t in TASKS}
            ),
            st.integers(1, 5),
        )
    )


TASKS = ("math", "code", "chat")


def goodput_policy(tables: dict[str, Path]) -> S[str]:
    table = st.sampled_from(sorted(str(p) for p in tables.values()))
    return st.builds(
        lambda t, hysteresis: (
            f"kind: goodput\ngoodput:\n  cost_table: {json.dumps(t)}\n  hysteresis: {hysteresis}\n"
        ),
        table,
        bad(True, st.floats(0, 1)).map(json.dumps),
    )


def policy_text(tables: dict[str, Path]) -> S[bytes]:
    valid = static_policy() | goodput_policy(tables)
    yaml_junk = st.builds(lambda key, value: f"{key}: {json.dumps(value)}\n", texts(10), any_json())
    text = weighted(
        (10, valid),
        (3, valid.flatmap(lambda doc: yaml_junk.map(lambda junk: doc + junk))),
        (2, yaml_junk),
        (
            1,
            st.sampled_from(
                [ALIAS_BOMB, "", "   \n", "---\n---\n", "[" * 5000, "kind: " + "9" * 5000]
            ),
        ),
        (1, st.text(max_size=200)),
    )
    data = text.map(lambda t: t.encode("utf-8", "surrogatepass"))
    return weighted(
        (20, data),
        (2, st.binary(max_size=64)),
        (1, st.just(b"kind: static\n#" + b"x" * 300_000)),
    )


def rollback_body() -> S[bytes]:
    version = weighted((5, st.integers(0, 40)), (2, wrong()))
    obj = st.builds(lambda v: {"version": v}, version) | any_json()
    return weighted(
        (8, st.builds(encode, obj, st.booleans())),
        (2, st.sampled_from(RAW_BODIES)),
    )


def auth_headers(token: str) -> S[dict[str, str]]:
    authorization = weighted(
        (12, st.just(f"Bearer {token}")),
        (2, st.none()),
        (1, st.sampled_from([f"bearer  {token} ", f"Basic {token}", "Bearer", "Bearer \xe9\xff"])),
        # Latin-1 text the HTTP client can send: aiohttp refuses DEL (0x7f) in a header
        # before it reaches the socket (raw header bytes: test_slow_clients.py).
        (
            1,
            st.text(
                st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"),
                max_size=40,
            ),
        ),
    )
    forwarded = st.fixed_dictionaries(
        {},
        optional={
            "x-forwarded-for": st.sampled_from(["127.0.0.1", "10.0.0.1, 127.0.0.1", "::1", "x"]),
            "forwarded": st.sampled_from(["for=127.0.0.1", 'for="[::1]:80"', "for=unknown", ";;"]),
            "if-match": st.sampled_from(['"nope"', "*", ""]),
        },
    )
    return st.builds(
        lambda a, f: f if a is None else {"authorization": a, **f}, authorization, forwarded
    )


def admin_sent(token: str, tables: dict[str, Path]) -> S[Sent]:
    # Not "/" or ".": those make another path (Starlette's plain 404 for unknown routes).
    segment = st.text(st.characters(exclude_characters="/.%"), min_size=1, max_size=12)
    version_path = weighted(
        (3, st.integers(0, 40).map(str)), (1, segment.map(lambda t: urllib.parse.quote(t, "")))
    )
    call = weighted(
        (5, policy_text(tables).map(lambda b: ("PUT", "/admin/policy", b))),
        (3, policy_text(tables).map(lambda b: ("POST", "/admin/policy/validate", b))),
        (3, rollback_body().map(lambda b: ("POST", "/admin/policy/rollback", b))),
        (1, st.just(("GET", "/admin/policy", None))),
        (1, st.just(("GET", "/admin/policy/versions", None))),
        (1, version_path.map(lambda v: ("GET", f"/admin/policy/versions/{v}", None))),
    )
    return st.builds(lambda c, h: Sent(c[0], c[1], c[2], h), call, auth_headers(token))


def cases(token: str, tables: dict[str, Path]) -> S[Case]:
    sent = weighted(
        (9, completion_sent("chat")),
        (7, completion_sent("completion")),
        (2, admin_sent(token, tables)),
    )
    companion = weighted((3, st.just(False)), (1, st.just(True)))
    return st.builds(Case, sent, companion)
