from controller.classifier.split import is_held_out


def test_split_is_deterministic_and_about_the_requested_share() -> None:
    groups = [f"group-{i}" for i in range(5000)]
    first = [is_held_out(g) for g in groups]
    assert first == [is_held_out(g) for g in groups]
    assert 0.17 < sum(first) / len(first) < 0.23
    assert not any(is_held_out(g, 0) for g in groups)
