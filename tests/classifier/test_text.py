"""What text the classifier reads from a request body."""

from controller.classifier.text import clip, request_segments, request_text


def chat(*messages: tuple[str, object]) -> dict[str, object]:
    return {"messages": [{"role": role, "content": content} for role, content in messages]}


def test_last_user_turn_comes_first_then_system_then_previous_answer_then_older_turns() -> None:
    body = chat(
        ("system", "SYS"),
        ("user", "OLD"),
        ("assistant", "ANSWER"),
        ("user", "LAST"),
    )
    assert request_text(body) == "LAST\nSYS\nANSWER\nOLD"


def test_content_parts_keep_text_and_skip_images() -> None:
    content = [
        {"type": "text", "text": "describe"},
        {"type": "image_url", "image_url": {"url": "data:..."}},
        {"type": "text", "text": "this"},
    ]
    assert request_text(chat(("user", content))) == "describe\nthis"


def test_completion_prompts_string_list_and_token_ids() -> None:
    assert request_text({"prompt": "def f():"}) == "def f():"
    assert request_text({"prompt": ["a", "b"]}) == "a\nb"
    assert request_text({"prompt": [101, 2023, 102]}) == ""
    assert request_text({"prompt": [[101, 2023]]}) == ""
    assert request_text({}) == ""


def test_long_turn_keeps_head_and_tail_within_budget() -> None:
    text = "H" * 5000 + "T" * 5000
    clipped = clip(text, 4000)
    assert len(clipped) == 4000
    assert clipped.startswith("H" * 2999) and clipped.endswith("T" * 1000)


def test_earlier_turns_only_fill_the_budget_the_last_turn_leaves() -> None:
    body = chat(("user", "x" * 100), ("user", "y" * 3990))
    text = request_text(body, max_chars=4000)
    assert len(text) <= 4000
    assert text.startswith("y" * 3990)


def test_huge_request_is_bounded_in_size_and_work() -> None:
    history = [{"role": "user", "content": "z" * 1000}] * 100_000
    body = {"messages": [*history, {"role": "user", "content": "q" * 10_000_000}]}
    text = request_text(body, max_chars=4000)
    assert len(text) <= 4000
    assert text == "q" * 2999 + "\n" + "q" * 1000


def test_malformed_messages_give_text_or_nothing_never_raise() -> None:
    assert request_text({"messages": [None, 3, {"role": "user", "content": None}]}) == ""
    assert request_text({"messages": [{"role": "assistant", "content": "only"}]}) == "only"


def test_segments_split_the_last_turn_from_its_context() -> None:
    body = chat(("system", "SYS"), ("user", "OLD"), ("assistant", "ANSWER"), ("user", "LAST"))
    assert request_segments(body) == ("LAST", "SYS\nANSWER\nOLD")
    assert request_segments({"prompt": "def f():"}) == ("def f():", "")
    assert request_segments({"messages": []}) == ("", "")


def test_segments_stay_within_the_budget_of_the_joined_text() -> None:
    body = chat(("user", "a" * 3000), ("assistant", "b" * 3000), ("user", "c" * 3500))
    focus, context = request_segments(body, max_chars=4000)
    assert focus + "\n" + context == request_text(body, max_chars=4000)
    assert len(focus) + len(context) + 1 <= 4000
