from training.classifier.split import is_held_out


def test_split_is_deterministic_and_about_the_requested_share() -> None:
    groups = [f"group-{i}" for i in range(5000)]
    first = [is_held_out(g) for g in groups]
    assert first == [is_held_out(g) for g in groups]
    assert 0.17 < sum(first) / len(first) < 0.23
    assert not any(is_held_out(g, 0) for g in groups)


def test_validation_is_carved_from_training_groups_only() -> None:
    from policies.types import Task
    from training.classifier.corpus import Example, user
    from training.classifier.dataset import build_dataset
    from training.classifier.split import is_validation

    groups = [f"group-{i}" for i in range(2000)]
    share = sum(is_validation(g) for g in groups) / len(groups)
    assert 0.17 < share < 0.23
    examples = [Example(user(f"text {g}"), Task.CHAT, "s", g) for g in groups]
    dataset = build_dataset(examples)
    held_out = set(dataset.subset(is_test=True))
    validation = set(dataset.validation_rows(20))
    train = set(dataset.train_rows(20))
    assert validation and not validation & held_out and not train & held_out
    assert not train & validation
    assert train | validation | held_out == set(range(len(groups)))
    assert dataset.train_rows(0) == dataset.subset(is_test=False)
