"""Topic-switch examples: a labelled request after a conversation of another label."""

from policies.types import Task
from training.classifier.corpus import Example, user
from training.classifier.split import is_held_out
from training.classifier.switches import topic_switches


def conversation(task: Task, index: int) -> Example:
    messages = [
        {"role": "user", "content": f"{task} question {index}"},
        {"role": "assistant", "content": "B"},
        {"role": "user", "content": "more"},
    ]  # two turns: a history, never itself a switched request
    return Example({"messages": messages}, task, "sharegpt_first", f"conv/{task}/{index}", "A")


def test_requests_keep_their_label_after_a_history_of_another_label() -> None:
    requests = [
        Example(user(f"{t} request {i}"), t, "s", f"req/{t}/{i}") for t in Task for i in range(40)
    ]
    histories = [conversation(t, i) for t in (Task.CODE, Task.CHAT) for i in range(60)]
    switches = list(topic_switches(requests + histories))
    assert {s.task for s in switches} == set(Task)
    for switch in switches:
        *history, last = switch.body["messages"]
        assert switch.source == "synthetic_switch"
        assert last["content"].startswith(f"{switch.task} request")  # the request stays last
        assert history[-1] == {"role": "assistant", "content": "A"}  # after a whole answer
        history_task = Task(history[0]["content"].split()[0])
        assert history_task != switch.task
        # Held-out requests only meet held-out conversations, and training ones training ones.
        history_group = f"conv/{history_task}/{history[0]['content'].split()[-1]}"
        assert is_held_out(history_group) == is_held_out(switch.group)


def test_same_seed_same_switches() -> None:
    requests = [Example(user(f"math {i}"), Task.MATH, "s", f"m/{i}") for i in range(30)]
    histories = [conversation(Task.CHAT, i) for i in range(30)]
    first = [s.body for s in topic_switches(requests + histories, seed=3)]
    assert first == [s.body for s in topic_switches(requests + histories, seed=3)]
