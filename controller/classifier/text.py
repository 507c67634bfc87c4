"""Which text of a request the classifier reads, and how much of it.

The drafter cares about what the *answer* will look like, and the request that predicts it
best is the latest user turn. So the text is built in this order, within ``max_chars``:

1. the last user turn (chat) or the prompt (completions); when it alone is longer than the
   budget, its head (3/4 of the budget) and tail (1/4) are kept, because users put the
   instruction either before or after a pasted document or code;
2. the system prompt(s) at the start of ``messages``, up to a quarter of the budget;
3. the assistant turn just before the last user turn, up to a quarter of the budget: a
   follow-up such as "continue" or "now add tests" is answered in the style of that turn;
4. earlier user turns, newest first, filling whatever budget is left. A long last turn thus
   leaves little room for context, while a short follow-up ("now in Rust") borrows it.

The model reads the last user turn (or the prompt) apart from the rest, the *context*
(:func:`request_segments`): the same words mean different things in the two places, e.g.
code in the previous answer makes a short "continue" likely code, while the same code pasted
in the last turn says the user wants it fixed.

Older assistant turns are not read. Content may be a string or a list of content parts, of which
only ``{"type": "text"}`` parts count. A completions ``prompt`` that is a list of strings is
read in order until the budget is full; token-id prompts carry no text and give "".
Work is bounded by the budget: huge strings are sliced, never scanned whole.

JSON bodies are plain dicts, lists and strs, so ``type(x) is dict`` / ``is list`` is tested
before the ``Mapping`` / ``Sequence`` ABC checks: after the process has slept, an ABC
``isinstance`` costs microseconds of cache misses (docs/classifier.md, "Native scorer").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeGuard

DEFAULT_MAX_CHARS = 4000
# How many leading messages may be system prompts; beyond this we stop looking for them.
MAX_SYSTEM_MESSAGES = 4
# How many trailing messages, or leading prompts of a batch, are looked at at all: bounds the
# work on a request with a huge history or batch.
MAX_SCANNED_ITEMS = 64


def clip(text: str, max_chars: int) -> str:
    """Keep at most ``max_chars`` of ``text``: its head (~3/4), a newline and its tail (1/4)."""
    if len(text) <= max_chars:
        return text
    num_tail = max_chars // 4
    if num_tail == 0:
        return text[:max_chars]
    num_head = max_chars - num_tail - 1
    return text[:num_head] + "\n" + text[len(text) - num_tail :]


def content_text(content: Any, max_chars: int) -> str:
    """The text of one message's ``content``: a string or a list of content parts."""
    if isinstance(content, str):
        return clip(content, max_chars)
    if type(content) is not list and not isinstance(content, Sequence):
        return ""
    return _join_bounded(_part_texts(content), max_chars)


def _part_texts(parts: Sequence[Any]) -> Iterable[str]:
    for part in parts:
        if (type(part) is dict or isinstance(part, Mapping)) and part.get("type") == "text":
            text = part.get("text")
            if isinstance(text, str):
                yield text
        elif isinstance(part, str):
            yield part


def _join_bounded(texts: Iterable[str], max_chars: int) -> str:
    pieces: list[str] = []
    num_left = max_chars
    for text in texts:
        if num_left <= 0:
            break
        piece = clip(text, num_left)
        pieces.append(piece)
        num_left -= len(piece) + 1
    return "\n".join(pieces)


def chat_text(messages: Sequence[Any], max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """The classifier text of a chat request (see the module docstring for the order)."""
    return "\n".join(piece for piece in chat_pieces(messages, max_chars) if piece)


def chat_pieces(messages: Sequence[Any], max_chars: int = DEFAULT_MAX_CHARS) -> list[str]:
    """The pieces of :func:`chat_text` in order; the first is the last user turn."""
    if len(messages) == 1:  # one user turn, the commonest request: same result, fewer calls
        only = messages[0]
        content = only.get("content") if type(only) is dict else None
        if type(content) is str and only.get("role") == "user":
            return [clip(content, max_chars)]
    user_indexes = _user_indexes_newest_first(messages)
    if not user_indexes:
        return [_join_bounded((_content(m, max_chars) for m in messages[-3:]), max_chars)]
    last = content_text(_get(messages[user_indexes[0]], "content"), max_chars)
    pieces = [last]
    num_left = max_chars - len(last) - 1
    system = _system_text(messages, min(num_left, max_chars // 4))
    if system:
        pieces.append(system)
        num_left -= len(system) + 1
    previous = _previous_answer(messages, user_indexes[0], min(num_left, max_chars // 4))
    if previous:
        pieces.append(previous)
        num_left -= len(previous) + 1
    for index in user_indexes[1:]:
        if num_left <= 0:
            break
        earlier = content_text(_get(messages[index], "content"), num_left)
        pieces.append(earlier)
        num_left -= len(earlier) + 1
    return pieces


def _user_indexes_newest_first(messages: Sequence[Any]) -> list[int]:
    first = max(0, len(messages) - MAX_SCANNED_ITEMS)
    return [
        i for i in range(len(messages) - 1, first - 1, -1) if _get(messages[i], "role") == "user"
    ]


def _previous_answer(messages: Sequence[Any], last_user: int, max_chars: int) -> str:
    if max_chars <= 0 or last_user == 0 or _get(messages[last_user - 1], "role") != "assistant":
        return ""
    return content_text(_get(messages[last_user - 1], "content"), max_chars)


def _system_text(messages: Sequence[Any], max_chars: int) -> str:
    if max_chars <= 0:
        return ""
    heads = messages[:MAX_SYSTEM_MESSAGES]
    texts = (
        content_text(_get(m, "content"), max_chars)
        for m in heads
        if _get(m, "role") in ("system", "developer")
    )
    return _join_bounded(texts, max_chars)


def _content(message: Any, max_chars: int) -> str:
    return content_text(_get(message, "content"), max_chars)


def _get(message: Any, key: str) -> Any:
    if type(message) is dict:  # JSON bodies: skips the ABC check, which is slow when cold
        return message.get(key)
    return message.get(key) if isinstance(message, Mapping) else None


def prompt_text(prompt: Any, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """The classifier text of a completions ``prompt``: str, list of str, or token ids."""
    if isinstance(prompt, str):
        return clip(prompt, max_chars)
    is_sequence = type(prompt) is list or isinstance(prompt, Sequence)
    if is_sequence and prompt and isinstance(prompt[0], str):
        head = prompt[:MAX_SCANNED_ITEMS]
        return _join_bounded((p for p in head if isinstance(p, str)), max_chars)
    return ""


def _is_message_list(messages: Any) -> TypeGuard[Sequence[Any]]:
    """A list (or other non-str sequence); ``type(...) is list`` first, as in ``_get``."""
    return type(messages) is list or (
        isinstance(messages, Sequence) and not isinstance(messages, str)
    )


def request_text(body: Mapping[str, Any], max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """The text the classifier reads from an OpenAI request body ("" when it has none)."""
    messages = body.get("messages")
    if _is_message_list(messages):
        return chat_text(messages, max_chars)
    return prompt_text(body.get("prompt"), max_chars)


def request_segments(
    body: Mapping[str, Any], max_chars: int = DEFAULT_MAX_CHARS
) -> tuple[str, str]:
    """``(focus, context)``: the last user turn or the prompt, and the rest of the text.

    Together they are exactly the pieces of :func:`request_text`, within the same budget;
    a completions prompt and a request without user turn have no context.
    """
    messages = body.get("messages")
    if _is_message_list(messages):
        pieces = chat_pieces(messages, max_chars)
        if len(pieces) == 1:
            return pieces[0], ""
        return pieces[0], "\n".join(piece for piece in pieces[1:] if piece)
    return prompt_text(body.get("prompt"), max_chars), ""
